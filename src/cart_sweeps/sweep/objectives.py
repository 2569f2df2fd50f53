"""What a stage's ledger values are: one metric (`sweep.metric`), or several (`sweep.metrics`, docs/decisions.md),
which make its ledger an Optuna multi-objective study. With several, the first is the ranking metric
(`sweep.metric` is set to it), and a pruner is refused: Optuna prunes no multi-objective trial.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from cart_sweeps.config import ConfigError
from cart_sweeps.metric import metric, require_error
from cart_sweeps.options import Pruner


def objectives(sweep: Any) -> list[str]:
    """The metrics the ledger's values are, in order: `sweep.metrics`, else `[sweep.metric]`."""
    return [str(m) for m in sweep.metrics] if sweep.get("metrics") else [str(sweep.metric)]


def several(sweep: Any) -> bool:
    return len(objectives(sweep)) > 1


def settle(sweep: DictConfig, stage: str, metric_given: bool) -> None:
    """Check `sweep.metrics` and make its first the ranking metric (`sweep.metric`); each mistake one line.
    `metric_given`: the command line set sweep.metric (a scale's own ranking metric, tiny's ppl_austen, is no
    choice of the user's to agree with the list)."""
    names = [str(m) for m in sweep.get("metrics") or []]
    if not names:
        return
    listed = f"sweep.metrics=[{','.join(names)}]"
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{listed} names {twice} twice: name each objective once")
    if metric_given and sweep.metric != names[0]:
        raise ConfigError(
            f"sweep.metric={sweep.metric} and {listed}: with sweep.metrics its first is the ranking metric; drop "
            f"sweep.metric, or put {sweep.metric} first"
        )
    for name in names:  # each a metric whose direction is known (preflight checks each is measured)
        if metric(name) is None:
            raise ConfigError(f"{listed}: {require_error(name)}")
    if len(names) > 1 and sweep.direction is not None:
        raise ConfigError(
            f"sweep.direction={sweep.direction} names one direction, and {listed} are several objectives, each in "
            "its metric's own direction: drop sweep.direction"
        )
    if len(names) > 1 and sweep.pruner != Pruner.none:
        raise ConfigError(
            f"sweep.pruner={sweep.pruner} with {listed}: Optuna cannot prune a trial of several objectives (stage "
            f"{stage}); drop sweep.pruner, or rank by one metric"
        )
    sweep.metric = names[0]


def meaning(sweep: Any) -> dict[str, Any]:
    """What the objectives add to a ledger study's meaning (`Stage.objective`): nothing for one metric (a study of
    one metric keeps its name), the list for several, so another list is another study."""
    return {"metrics": objectives(sweep)} if several(sweep) else {}
