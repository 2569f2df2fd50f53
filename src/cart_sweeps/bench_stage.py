"""`python -m cart_sweeps.bench_stage [OVERRIDE ...]`: how much of a stage's wall time its runs use.

Runs a stage (default: Stage 1, tiny, 2 slots) in a fresh folder through the real command and prints its wall
time against its runs' own (`wall_time_s`) over the slots. The rest is the pool's overhead, split into the
start-up (to the first run's first step) and what each run costs its slot besides its own time.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from cart_sweeps.record.runfolder import read_summary
from cart_sweeps.stagerecord.ledger import LEDGER_FILES
from cart_sweeps.sweep.expand import Stage
from cart_sweeps.sweep.pool import capacity

DEFAULT = ["stage=1", "scale=tiny", "launcher.slots=2"]


def measure(overrides: list[str], runs: Path) -> dict[str, float]:
    """Run the stage into `runs` (which must hold none of it yet) and read its figures back."""
    stage = Stage(overrides)
    slots = capacity(stage.base.launcher)
    prepare = [sys.executable, "-m", "cart_sweeps.data.prepare", f"data={stage.base.data.name}"]
    subprocess.run(prepare, check=True, stdout=subprocess.DEVNULL)  # not timed: a stage finds its data ready
    env = {**os.environ, "CART_SWEEPS_RUNS": str(runs)}
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "cart_sweeps", *overrides], env=env)
    wall = time.time() - started
    if done.returncode != 0:
        sys.exit(f"bench_stage: the stage failed (exit {done.returncode}); see its output above")
    storage = f"sqlite:///{runs / stage.name / LEDGER_FILES['sqlite']}"
    trials = optuna.load_study(study_name=stage.name, storage=storage).trials
    timings = []
    for trial in trials:
        summary = read_summary(Path(trial.user_attrs["run_dir"]))
        assert summary is not None and trial.datetime_start is not None
        timings.append(RunTiming(trial.datetime_start.timestamp(), summary.first_step_at, summary.wall_time_s or 0.0))
    return figures(timings, slots, started, wall)


@dataclass(frozen=True)
class RunTiming:
    launched: float
    first_step: float | None
    own_s: float


def figures(timings: list[RunTiming], slots: int, started: float, wall: float) -> dict[str, float]:
    own = sum(t.own_s for t in timings)
    first_steps = [t.first_step for t in timings if t.first_step is not None]
    start_up = min(first_steps) - started if first_steps else math.nan
    after_start_up = wall - start_up
    return {
        "runs": len(timings),
        "slots": slots,
        "stage_wall_s": wall,
        "runs_own_s": own,
        "ratio": wall / (own / slots),
        "start_up_s": start_up,
        "overhead_per_run_ms": 1000 * (after_start_up * slots - own) / len(timings),
        "ratio_after_start_up": after_start_up / (own / slots),
        "median_launch_to_first_step_s": statistics.median(
            [t.first_step - t.launched for t in timings if t.first_step is not None] or [math.nan]
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cart_sweeps.bench_stage", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help=f"the stage's overrides (default: {' '.join(DEFAULT)})")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-stage-") as tmp:
        show(measure(args.overrides or DEFAULT, Path(tmp) / "runs"))


def show(figures: dict[str, float]) -> None:
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:.2f}" if isinstance(value, float) else f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
