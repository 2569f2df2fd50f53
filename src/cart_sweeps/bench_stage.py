"""`python -m cart_sweeps.bench_stage [OVERRIDE ...]`: how much of a stage's wall time its runs use.

Runs a stage (default: Stage 1 at the tiny scale on 2 slots, 64 runs) in a fresh folder through the real
command, then prints its wall time, the sum of its runs' own time (`wall_time_s` in their summaries), the
slots, the ratio of the wall time to its ideal (that sum / slots) and the median time from a run's launch
(its trial's start in the ledger) to its first training step. What is not the runs' own time is the
pool's overhead: starting processes, importing, composing, loading data, building models, polling.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from cart_sweeps.record.runfolder import read_summary
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
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cart_sweeps", *overrides], env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"bench_stage: the stage failed (exit {done.returncode}); see its output above")
    storage = f"sqlite:///{runs / stage.name / 'ledger.db'}"
    trials = optuna.load_study(study_name=stage.name, storage=storage).trials
    own, to_first_step = 0.0, []
    for trial in trials:
        summary = read_summary(Path(trial.user_attrs["run_dir"]))
        assert summary is not None and trial.datetime_start is not None
        own += summary.wall_time_s or 0.0
        if summary.first_step_at is not None:
            to_first_step.append(summary.first_step_at - trial.datetime_start.timestamp())
    return {
        "runs": len(trials),
        "slots": slots,
        "stage_wall_s": wall,
        "runs_own_s": own,
        "ratio": wall / (own / slots),
        "median_launch_to_first_step_s": statistics.median(to_first_step) if to_first_step else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cart_sweeps.bench_stage", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help=f"the stage's overrides (default: {' '.join(DEFAULT)})")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-stage-") as tmp:
        figures = measure(args.overrides or DEFAULT, Path(tmp) / "runs")
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:.2f}" if isinstance(value, float) else f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
