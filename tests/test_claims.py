"""Two stages sharing runs, launched at the same moment on one runs root, train each shared run once: the stage
that claims a run first trains it, the other waits for it and references its result; a claim whose holder is
killed (SIGKILL) frees the run for the other stage. Real drivers, real training, tiny scale."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from stages import completed, env, leftovers, sweep_cmd, user_stage, wait_for, with_fault

pytestmark = pytest.mark.slow  # two real stages at once (~40 s)

GRID = """\
grid:
  model.n_loops: [1, 2]
  seed: [1, 2]
recipe:
  model.d_model: 32
  model.n_prelude: 1
"""
TINY = ["scale=tiny", "trainer.steps=6"]


def two_stages(tmp_path: Path) -> tuple[Path, Path]:
    """A config folder holding stages `a` and `b`, one grid (so the same four run ids), and the runs root."""
    user_stage(tmp_path, f"name: a\n{GRID}")
    return user_stage(tmp_path, f"name: b\n{GRID}"), tmp_path / "runs"


def trained(runs: Path) -> dict[str, list[str]]:
    """Run id -> the stages whose folder holds its training, completed."""
    out: dict[str, list[str]] = {}
    for summary in sorted(runs.glob("*/*/summary.json")):
        if (s := json.loads(summary.read_text()))["status"] == "completed":
            out.setdefault(s["run_id"], []).append(summary.parent.parent.name)
    return out


def launch(
    cfg: Path, runs: Path, stage: str, environ: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """The stage's driver, started; its output goes to the returned log."""
    log = runs.parent / f"{stage}.log"
    command = sweep_cmd("--config-dir", str(cfg), f"stage={stage}", *TINY)
    with log.open("w") as out:
        return subprocess.Popen(command, env=environ or env(runs), stdout=out, stderr=subprocess.STDOUT), log


def test_two_stages_launched_at_once_train_each_shared_run_once(tmp_path, data_cache):
    cfg, runs = two_stages(tmp_path)
    drivers = [launch(cfg, runs, stage) for stage in ("a", "b")]
    codes = [driver.wait(timeout=600) for driver, _ in drivers]
    said = [log.read_text() for _, log in drivers]
    assert codes == [0, 0], "\n".join(s[-3000:] for s in said)
    assert "Traceback" not in "".join(said)
    by_run = trained(runs)
    assert len(by_run) == 4 and all(len(stages) == 1 for stages in by_run.values()), by_run  # 4 trainings, not 8
    for stage in ("a", "b"):  # each stage's ledger holds every run's result, its own or the other's
        done = completed(runs, stage)
        assert sorted(t.user_attrs["run_id"] for t in done) == sorted(by_run)
        for trial in done:
            (owner,) = by_run[trial.user_attrs["run_id"]]
            assert trial.user_attrs.get("owner", stage) == owner
            summary = json.loads((Path(trial.user_attrs["run_dir"]) / "summary.json").read_text())
            assert trial.value == pytest.approx(summary["ppl_austen"])
    assert any("trains it now, waiting for its result" in s for s in said), said


def test_a_claim_whose_holder_is_killed_frees_the_run_for_the_other_stage(tmp_path, data_cache):
    """Stage a's driver is killed (SIGKILL) while its runs train (held at their third step); stage b, launched
    meanwhile and waiting on a's claims, trains the runs a held itself, never wedged."""
    cfg, runs = two_stages(tmp_path)
    mark = tmp_path / "paused"
    first, first_log = launch(cfg, runs, "a", with_fault(runs, "step:pause:3", mark))
    second = None
    try:
        wait_for(mark.exists, 300, "stage a's first run to pause", first_log)
        second, log = launch(cfg, runs, "b")
        wait_for(lambda: "waiting for its result" in log.read_text(), 300, "stage b to wait on a's claim", log)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
        code = second.wait(timeout=600)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    out = log.read_text()
    assert code == 0, out[-3000:]
    wait_for(lambda: not leftovers(runs), 120, "the killed driver's runs to end")
    done = completed(runs, "b")
    assert len(done) == 4, out[-3000:]
    by_run = trained(runs)
    assert len(by_run) == 4 and all(stages == ["b"] for stages in by_run.values()), by_run  # a finished none
    assert all("owner" not in t.user_attrs for t in done)
