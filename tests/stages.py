"""Helpers for tests that launch real stages: the driver command, its environment, the ledger, the processes.

`with_fault` runs every process of a stage with tests/faults on PYTHONPATH, so a named fault stops or
breaks a real process at an exact point (see tests/faults/sitecustomize.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

FAULTS = Path(__file__).parent / "faults"
COMMON = ["launcher.slots=2", "launcher.poll_s=0.2"]


def sweep_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cart_sweeps", "-m", *args, *COMMON]


def env(runs: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "CART_SWEEPS_RUNS": str(runs), "PYTHONUNBUFFERED": "1", **extra}


def with_fault(runs: Path, fault: str, mark: Path) -> dict[str, str]:
    """The environment of a stage whose processes carry the fault `fault` (its pid lands in `mark`)."""
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p)
    return env(runs, PYTHONPATH=path, CART_FAULT=fault, CART_FAULT_MARK=str(mark))


def sweep(runs: Path, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sweep_cmd(*args), env=env(runs, **extra), capture_output=True, text=True, timeout=timeout)


def trials(runs: Path, stage: str = "1") -> list[optuna.trial.FrozenTrial]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=stage, storage=f"sqlite:///{runs / stage / 'ledger.db'}").trials


def completed(runs: Path, stage: str = "1") -> list[optuna.trial.FrozenTrial]:
    """Completed trials so far (none while the driver has not created its study yet)."""
    if not (runs / stage / "ledger.db").exists():
        return []
    try:
        return [t for t in trials(runs, stage) if t.state == TrialState.COMPLETE]
    except KeyError:
        return []


def leftovers(root: Path) -> list[str]:
    """Command lines of processes still working under `root` (job controllers and tasks)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(root) in cmd and int(proc.name) != os.getpid() and state != "Z":
            found.append(f"{proc.name}: {cmd}")
    return found


def wait_for(predicate, timeout: float, what: str, log: Path | None = None) -> None:
    """Poll `predicate`; on timeout fail with the driver's log, which says what went wrong."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; the driver said:\n{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.1)


def wait_until_gone(root: Path, timeout: float) -> None:
    """Every process working under `root` ends within `timeout` s; otherwise fail naming them."""
    deadline = time.monotonic() + timeout
    while found := leftovers(root):
        if time.monotonic() > deadline:
            listing = "\n".join(found)
            pytest.fail(f"processes still running {timeout:.0f} s after their driver ended:\n{listing}")
        time.sleep(0.1)


def run_quick_demo(root: Path) -> str:
    """`python -m cart_sweeps.demo --quick` with its runs and tables under `root`; its output."""
    env = {**os.environ, "CART_SWEEPS_RUNS": str(root / "runs"), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "cart_sweeps.demo", "--quick", "--out", str(root / "out")]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-5000:]
    return done.stdout


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """`folder` as a tmpfs of `size` (3m, 80m) for the block: a disk a test can fill (root only; skipped elsewhere)."""
    folder.mkdir(parents=True, exist_ok=True)
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    ).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """`folder` read-only for the block, for root too (a bind mount remounted ro; root passes permission checks,
    so chmod would not do; skipped where mounting is not allowed)."""
    if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode:
        pytest.skip("a read-only bind mount needs root")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def user_stage(base: Path, text: str) -> Path:
    """A config folder under `base` holding `text`, a stage file named as its `name:` says: for --config-dir."""
    (base / "cfg" / "stage").mkdir(parents=True, exist_ok=True)
    (base / "cfg" / "stage" / f"{text.split()[1]}.yaml").write_text(text)
    return base / "cfg"


def dated_by_hand(run: Path) -> dict[int, float]:
    """When a run logged each step's rows (Unix time), by hand: training's start (summary.json's first_step_at)
    plus each train row's window, its tokens since the row before (from step 0) over its tokens/s."""
    start = json.loads((run / "summary.json").read_text())["first_step_at"]
    at, before, out = start, None, {}
    for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        if row["kind"] == "train":
            at += (row["tokens"] - (before["tokens"] if before else 0)) / row["tokens_per_s"]
            before = row
        out.setdefault(row["step"], at)
    return out
