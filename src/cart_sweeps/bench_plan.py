"""`python -m cart_sweeps.bench_plan "STAGE OVERRIDES" ...`: `plan`'s estimate of each stage's time on this
machine against the stage's actual wall time, one table row per stage.

Each stage (its overrides in one argument, as `python -m cart_sweeps` takes them) is planned `--calls` times
(the estimate's spread from call to call), then run through the real command into one runs folder, in the
order given: a later stage is estimated from the runs the earlier ones finished, as on a machine in use. The
load average before and after each stage is printed beside it: a loaded machine's wall times are its load's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from cart_sweeps.compose import run_cli
from cart_sweeps.plan import here_estimate, rows, stage_slots
from cart_sweeps.sweep.expand import Stage


@dataclass(frozen=True)
class Row:
    stage: str
    runs: int
    slots: int
    estimates_s: list[float]
    basis: str
    actual_s: float
    load: tuple[float, float]

    def cells(self) -> list[str]:
        first, low, high = self.estimates_s[0], min(self.estimates_s), max(self.estimates_s)
        return [
            self.stage,
            str(self.runs),
            str(self.slots),
            f"{first:.0f}",
            f"{(high - low) / low:.0%}" if low else "-",
            f"{self.actual_s:.0f}",
            f"{first / self.actual_s:.2f}",
            f"{self.load[0]:.1f} / {self.load[1]:.1f}",
            self.basis,
        ]


USAGE = __doc__ or ""
HEADER = ["stage", "runs", "slots", "estimate s", "spread", "actual s", "est/actual", "load before/after", "basis"]


def estimate(overrides: list[str]) -> tuple[float, int, int, str]:
    """`plan`'s estimate of the stage here: seconds, runs, slots, what its pace came from."""
    stage = Stage(overrides)
    slots = stage_slots(stage.base)
    est = here_estimate(stage, slots, rows(stage))
    if est is None:
        sys.exit(f"bench_plan: {' '.join(overrides)} does not run on this machine (a GPU named, or another launcher)")
    return est.seconds, est.runs, slots, est.pace.basis


def planned_apart(overrides: list[str]) -> tuple[float, int, int, str]:
    """`estimate` in a process of its own, as two `plan` calls are."""
    command = [sys.executable, "-m", "cart_sweeps.bench_plan", "--estimate", shlex.join(overrides)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_plan: planning {shlex.join(overrides)} failed: {done.stderr.strip()}")
    seconds, runs, slots, basis = json.loads(done.stdout)
    return seconds, runs, slots, basis


def measure(overrides: list[str], calls: int) -> Row:
    """Plan the stage `calls` times, then run it and time it (the runs folder: $CART_SWEEPS_RUNS)."""
    planned = [planned_apart(overrides) for _ in range(calls)]
    before = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cart_sweeps", *overrides], stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"bench_plan: {' '.join(overrides)} failed (exit {done.returncode}); see its output above")
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("stage=")), "?")
    _, runs, slots, basis = planned[0]
    return Row(name, runs, slots, [p[0] for p in planned], basis, wall, (before, os.getloadavg()[0]))


def table(rows_: list[Row]) -> str:
    lines = [HEADER, ["---"] * len(HEADER), *(r.cells() for r in rows_)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cart_sweeps.bench_plan", description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="+", help='one stage\'s overrides per argument: "stage=1 scale=tiny ..."')
    parser.add_argument("--calls", type=int, default=5, help="plan calls per stage, for the spread (default 5)")
    parser.add_argument("--runs", type=Path, help="the runs folder (default: a new temporary one)")
    parser.add_argument("--estimate", action="store_true", help="print the first stage's estimate only, as JSON")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.estimate:
        print(json.dumps(run_cli(estimate, USAGE, shlex.split(args.stages[0]))))  # --config-dir as plan takes it
        return
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        os.environ["CART_SWEEPS_RUNS"] = str(args.runs or Path(tmp) / "runs")
        measured = []
        for stage in args.stages:
            measured.append(measure(shlex.split(stage), args.calls))
            print(table(measured[-1:]).splitlines()[-1], flush=True)
    print(table(measured))


if __name__ == "__main__":
    main()
