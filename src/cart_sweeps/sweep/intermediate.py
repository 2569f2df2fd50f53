"""A running trial's learning curve: each evaluation's sweep metric, reported to its Optuna trial as an
intermediate value at its step (optuna-dashboard draws these curves; a pruner judges them).

Runs train in other processes (submitit jobs, perhaps on other nodes), so the driver reads what each run
has logged to its folder's metrics.jsonl while it polls, rather than each run writing to the study: the
driver stays the ledger's one writer, and no job needs a connection to it.
"""

from __future__ import annotations

import math
from pathlib import Path

import optuna
from omegaconf import DictConfig
from optuna.trial import Trial

from cart_sweeps.config import ConfigError
from cart_sweeps.options import Pruner
from cart_sweeps.record.metrics import read_metrics
from cart_sweeps.record.runfolder import METRICS, read_summary, write_summary
from cart_sweeps.status import RunStatus


def make_pruner(sweep: DictConfig, stage: str, search: bool) -> optuna.pruners.BasePruner:
    """The study's pruner (`sweep.pruner`); one line when asked of a grid, whose every point is wanted."""
    if sweep.pruner == Pruner.none:
        return optuna.pruners.NopPruner()
    if not search:
        raise ConfigError(f"sweep.pruner={sweep.pruner} prunes searches; stage {stage} is a grid: drop it")
    if sweep.pruner == Pruner.median:
        # n_warmup_steps=1: the step-0 evaluation measures the shared initialisation, not the trial's params
        return optuna.pruners.MedianPruner(n_startup_trials=sweep.startup_trials, n_warmup_steps=1)
    return optuna.pruners.HyperbandPruner()  # resources are training steps; the largest is the first finished run's


def logged_evals(run_dir: Path, metric: str) -> dict[int, float]:
    """Step -> `metric` of each evaluation the run has logged so far (a line cut off mid-write is skipped)."""
    out = {}
    for row in read_metrics(run_dir / METRICS):
        value = row.get(metric) if row.get("kind") == "eval" else None
        if isinstance(value, int | float) and math.isfinite(value):
            out[int(row["step"])] = float(value)
    return out


def report_new(trial: Trial, run_dir: Path, metric: str, reported: set[int]) -> bool:
    """Report the evaluations not in `reported` (which grows); returns whether there were any."""
    new = {step: value for step, value in logged_evals(run_dir, metric).items() if step not in reported}
    for step, value in sorted(new.items()):
        trial.report(value, step)
        reported.add(step)
    return bool(new)


def record_pruned(run_dir: Path) -> None:
    """Say so in the run folder too: its summary, written as the run was stopped, reads interrupted."""
    summary = read_summary(run_dir)
    if summary is not None:
        summary.status = RunStatus.PRUNED
        write_summary(run_dir, summary)
