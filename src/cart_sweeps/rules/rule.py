"""A stage's rule: the runs a stage adds after its grid and what `plan` says of them, chosen once per stage
(rules.for_stage) so that nothing else tells the kinds apart. This base runs the grid, adds nothing, and
refuses in one line the options that cannot add or promote runs here (each kind adds its own: `check_own`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from optuna.distributions import BaseDistribution, IntDistribution
from optuna.trial import FrozenTrial

from cart_sweeps.config import ConfigError
from cart_sweeps.rules.axes import SEED, D
from cart_sweeps.rules.decide import looks, seed_order
from cart_sweeps.stagerecord.runset import StageRecord

if TYPE_CHECKING:
    from cart_sweeps.stagerecord.ledger import Ledger

WHY = "added"  # the ledger attribute of an added run: why it exists


class Expanded(Protocol):
    """What a rule reads of an expanded stage (sweep/expand.py's Stage)."""

    name: str
    spec: Any  # the composed stage group
    base: Any  # the stage's base config
    axes: dict[str, list[Any]]
    args: Any  # its command line (sweep/overrides.py's Arguments)
    runs: list[Any]  # its grid's runs (sweep/expand.py's Run)
    sweep_dir: Path

    @property
    def recipe(self) -> dict[str, Any]: ...

    def run(self, params: dict[str, Any]) -> Any: ...

    def dists(self, params: dict[str, Any]) -> dict[str, BaseDistribution]: ...


@dataclass(frozen=True)
class Added:
    """A run the rule adds, and why."""

    run: Any  # sweep/expand.py's Run
    why: str


class StageRule:
    """A stage's rule (this base: a grid and nothing added)."""

    def __init__(self, stage: Expanded) -> None:
        self.stage = stage

    def grid(self, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """The axes the stage expands (a ladder adds the horizon)."""
        return axes

    def first(self, point: dict[str, Any]) -> bool:
        """Whether a point of the axes' product is a run of the grid, not one the rule adds later."""
        return True

    def adds(self) -> bool:
        """Whether the rule adds seeds to the grid's cells (stage.max_seeds, stage.replicates)."""
        return self.stage.spec.max_seeds is not None or self.stage.spec.replicates > 0

    def dists(self, params: dict[str, Any]) -> dict[str, BaseDistribution]:
        """`stage.dists`, with the seed's range covering every seed the stage may add."""
        out = self.stage.dists(params)
        if self.adds() and SEED in params:
            order = seed_order(self.stage.axes.get(SEED, []))
            out[SEED] = IntDistribution(min(order), max(order))
        return out

    def earlier(self, history: dict[str, list[FrozenTrial]]) -> list[Added]:
        """The runs earlier launches added to this launch's (so a relaunch resumes or skips them)."""
        ours = self.added_here()
        last = (trials[-1] for trials in history.values())
        found = [t for t in last if WHY in t.user_attrs and ours and ours(dict(t.params))]
        return [Added(self.stage.run(dict(t.params)), str(t.user_attrs[WHY])) for t in found]

    def added_here(self) -> Callable[[dict[str, Any]], bool] | None:
        """Whether an added run's params belong to this launch (None: the rule adds none)."""
        return None

    def next_round(self, ledger: Ledger, say: Callable[[str], None]) -> list[Added]:
        """The runs the rule adds now, each with why (none while a result it needs is missing)."""
        return []

    def plan_lines(self, hours: dict[str, float]) -> list[str]:
        """What `plan` says of the runs the rule adds (`hours`: run id -> estimated GPU-hours)."""
        return []

    def looks(self) -> int:
        """How often the rule may decide (decide.looks): each look tests at alpha / looks."""
        return looks(len(self.stage.axes.get(SEED, [])), self.stage.spec.max_seeds)

    def spending_from(self) -> int | None:
        """The grid's seeds where the rule spends alpha over seed looks (decide.look_level), else None."""
        return None

    def recorded_looks(self) -> int:
        """The looks the record keeps: this launch's, or an earlier's more (its added runs stay in the run set)."""
        earlier = StageRecord.read(self.stage.sweep_dir, self.stage.base.scale.name)
        return max(self.looks(), earlier.looks if earlier else 1)

    def launch_overrides(self, run: Any) -> list[str]:
        """Overrides a run takes as it launches, no part of its identity (a ladder's branch)."""
        return []

    def check(self) -> None:
        """Refuse, in one line, options that cannot add or promote runs in this stage."""
        stage, spec = self.stage, self.stage.spec
        if spec.sentinels and (spec.select != "zoom" or spec.sentinels < 0):
            raise ConfigError(
                f"stage.sentinels={spec.sentinels} promotes configurations below the zoom's cutoff: it needs "
                f"stage.select=zoom and a count >= 0 (stage {stage.name} has select={spec.select})"
            )
        if spec.equivalence is not None and not 0 < spec.equivalence < 1:
            raise ConfigError(
                f"stage.equivalence={spec.equivalence:g} must be a relative margin between 0 and 1 (0.01: options "
                "within 1% of the best are equivalent)"
            )
        if spec.drift is not None and not 0 <= spec.drift < math.inf:
            raise ConfigError(
                f"stage.drift={spec.drift} must be a finite number >= 0 (a gap's change per unit of ln(horizon))"
            )
        if spec.replicates < 0:
            raise ConfigError(f"stage.replicates={spec.replicates} must be >= 0 (configurations re-run per width)")
        self.check_own()
        if spec.replicates:
            if SEED in stage.axes or SEED in stage.args.passed:
                raise ConfigError(
                    f"stage.replicates re-runs a one-seed screen with more seeds: stage {stage.name} already sets "
                    "its seeds (drop seed=... or use stage.max_seeds)"
                )
            if D not in stage.axes:
                raise ConfigError(
                    f"stage.replicates picks configurations per width: stage {stage.name} has no {D} axis"
                )
        if self.adds() and not stage.runs:
            raise ConfigError("stage.max_seeds and stage.replicates add seeds to a grid stage, not to a search")

    def check_own(self) -> None:
        """The kind's own checks of its options."""

    def check_max_seeds(self, where: str = "") -> None:
        """stage.max_seeds between the grid's seeds and the most the seed list holds (`where`: said after)."""
        most, grid = self.stage.spec.max_seeds, self.stage.axes[SEED]
        if most is not None and not len(grid) <= most <= len(seed_order(grid)):
            raise ConfigError(
                f"stage.max_seeds={most} must lie between the grid's {len(grid)} seeds and "
                f"{len(seed_order(grid))}{where}"
            )
