"""`python -m cart_sweeps.bench_scale [--seeds N] [--one-step-seeds M] [--ledger-trials T]`: the driver at scale.

Through the real commands, in a fresh folder: plan's and the driver's start's time and peak memory on 64 x N
runs, one-step runs per minute and relaunches of the finished stage, and the ledger's writes and reads.
Goals (issue 26): plan of 10,240 runs <= 5 s and <= 400 MB; the first run within 8 s at <= 400 MB; one-step
runs >= 200 a minute; a relaunch of a finished 1,024-run stage within 2 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from cart_sweeps.bench_stage import show
from cart_sweeps.record.runfolder import CONFIG
from cart_sweeps.sweep.pace import cached_benchmark

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

STAGE = ["stage=1", "scale=tiny", "launcher.slots=2"]


def _peak_mb(pid: int) -> float:
    """A live process's peak resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run `command` to its end: (seconds, its peak resident memory in MB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"bench_scale: {' '.join(command)} failed (exit {proc.returncode})")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def plan(seeds: int, env: dict[str, str]) -> dict[str, float]:
    seconds, peak = _timed([sys.executable, "-m", "cart_sweeps.plan", *STAGE, f"seed=range(0,{seeds})"], env)
    return {f"plan_{64 * seeds}_runs_s": seconds, f"plan_{64 * seeds}_runs_peak_mb": peak}


def driver_start(seeds: int, runs: Path, env: dict[str, str]) -> dict[str, float]:
    """Seconds from the command to the first run's folder, and the driver's peak memory until then."""
    command = [sys.executable, "-m", "cart_sweeps", "-m", *STAGE, f"seed=range(0,{seeds})", "trainer.steps=1"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not any((runs / "1").glob(f"*/{CONFIG}")):
            if proc.poll() is not None:
                sys.exit(f"bench_scale: the driver exited ({proc.returncode}) before its first run")
            time.sleep(0.05)
        seconds, peak = time.perf_counter() - t0, _peak_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait()
    return {f"driver_{64 * seeds}_runs_first_run_s": seconds, f"driver_{64 * seeds}_runs_peak_mb": peak}


def one_step_runs(seeds: int, relaunches: int, env: dict[str, str]) -> dict[str, float]:
    """A stage of one-step runs, then its relaunches (each must find all of it done): their median and fastest."""
    command = [sys.executable, "-m", "cart_sweeps", "-m", *STAGE, f"seed=range(0,{seeds})", "trainer.steps=1"]
    seconds, _ = _timed(command, env)
    again = [_timed(command, env)[0] for _ in range(relaunches)]
    n = 64 * seeds
    return {
        "one_step_runs": n,
        "one_step_runs_per_min": n / seconds * 60,
        f"relaunch_{n}_done_runs_s": statistics.median(again),
        f"relaunch_{n}_done_runs_fastest_s": min(again),
    }


def ledger_writes(trials: int, folder: Path) -> dict[str, float]:
    """Milliseconds per `Ledger.start` and per `Ledger.finish` (after an intermediate value), and commits per finish."""
    from optuna.distributions import BaseDistribution, IntDistribution
    from optuna.storages import RDBStorage
    from sqlalchemy import event

    from cart_sweeps.adapters.optuna import database_of
    from cart_sweeps.record.summary import RunSummary
    from cart_sweeps.stagerecord.ledger import Ledger
    from cart_sweeps.status import RunStatus

    ledger = Ledger.open(folder, "1", "sqlite", objective={"metric": "ppl_austen"})
    commits: list[int] = []
    event.listen(cast(RDBStorage, database_of(ledger.study)).engine, "commit", lambda conn: commits.append(1))
    seeds: dict[str, BaseDistribution] = {"seed": IntDistribution(0, trials)}
    started = finished = 0.0
    finish_commits = 0
    for i in range(trials):
        t0 = time.perf_counter()
        trial = ledger.start({"seed": i}, seeds, {"run_id": f"{i:08x}", "label": f"d32-P2-R2-s{i}"})
        started += time.perf_counter() - t0
        trial.report(150.0, step=20)
        before, t0 = len(commits), time.perf_counter()
        ledger.finish(trial, RunSummary(RunStatus.COMPLETED, metrics={"ppl_austen": 100.0 + i}, step=40), "ppl_austen")
        finished += time.perf_counter() - t0
        finish_commits += len(commits) - before
    return {
        "ledger_start_ms": 1000 * started / trials,
        "ledger_finish_ms": 1000 * finished / trials,
        "ledger_commits_per_finish": finish_commits / trials,
    }


def ledger_read(trials: int, folder: Path) -> dict[str, float]:
    """Seconds to read a ledger of `trials` finished trials: as the project reads it, and as Optuna does."""
    from optuna.distributions import BaseDistribution, IntDistribution
    from optuna.trial import TrialState, create_trial

    from cart_sweeps.stagerecord.ledger import Ledger

    seeds: dict[str, BaseDistribution] = {"seed": IntDistribution(0, trials)}

    def finished(i: int) -> FrozenTrial:
        attrs = {
            "run_id": f"{i:08x}",
            "label": f"d32-P2-R2-s{i}",
            "overrides": ["stage=1", "scale=tiny", f"seed={i}"],
            "run_dir": str(folder / f"d32-P2-R2-s{i}-{i:08x}"),
            "config_id": "0" * 16,
            "status": "completed",
            "results": {"ppl_austen": 100.0 + i, "ppl_bible": 90.0, "rho": 0.5, "step": 40, "wall_time_s": 9.5},
        }
        return create_trial(
            state=TrialState.COMPLETE,
            value=100.0 + i,
            params={"seed": i},
            distributions=seeds,
            user_attrs=attrs,
            intermediate_values={20: 150.0, 40: 100.0 + i},
        )

    Ledger.open(folder, "1", "sqlite").study.add_trials([finished(i) for i in range(trials)])
    read_as_the_project = cast(Ledger, Ledger.read(folder, "1", "sqlite")).attempts
    study = cast(Ledger, Ledger.read(folder, "1", "sqlite")).study

    def read_by_optuna() -> list[FrozenTrial]:
        return study.get_trials(deepcopy=False)

    figures = {}
    for name, read in (("", read_as_the_project), ("_optuna_orm", read_by_optuna)):
        t0 = time.perf_counter()
        if len(read()) != trials:
            sys.exit(f"bench_scale: the ledger read back does not hold its {trials} trials")
        figures[f"ledger_read_{trials}_trials{name}_s"] = time.perf_counter() - t0
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cart_sweeps.bench_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=160, help="seeds for plan and driver start (x64 runs)")
    parser.add_argument("--one-step-seeds", type=int, default=16, help="seeds of the one-step stage (x64 runs)")
    parser.add_argument("--relaunches", type=int, default=5, help="relaunches of the finished one-step stage")
    parser.add_argument("--ledger-trials", type=int, default=0, help="trials of the ledger read back (0: none)")
    parser.add_argument("--ledger-writes", type=int, default=200, help="trials started and finished (0: none)")
    args = parser.parse_args(argv)
    subprocess.run(
        [sys.executable, "-m", "cart_sweeps.data.prepare", "data=embedded"], check=True, stdout=subprocess.DEVNULL
    )
    cached_benchmark()  # not timed: measured once per machine, as the data is prepared once (sweep/pace.py)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        env = {**os.environ, "CART_SWEEPS_RUNS": str(Path(tmp) / "big")}
        figures |= plan(args.seeds, env)
        figures |= driver_start(args.seeds, Path(tmp) / "big", env)
        small = {**os.environ, "CART_SWEEPS_RUNS": str(Path(tmp) / "small")}
        figures |= one_step_runs(args.one_step_seeds, args.relaunches, small)
        if args.ledger_writes:
            figures |= ledger_writes(args.ledger_writes, Path(tmp) / "writes")
        if args.ledger_trials:
            figures |= ledger_read(args.ledger_trials, Path(tmp) / "ledger")
    show(figures)


if __name__ == "__main__":
    main()
