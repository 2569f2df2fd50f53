"""The stage options that add or promote runs (`stage.max_seeds`, `stage.replicates`, `stage.sentinels`, a
ladder's `stage.rungs`), checked in one line as a stage is expanded.

They live apart from the rules that act on them (sweep/adaptive.py, sweep/ladder.py), which read an expanded
stage: the expansion calls these checks, and imports neither rule.
"""

from __future__ import annotations

from typing import Any, Protocol

from cart_sweeps.config import ConfigError
from cart_sweeps.decide import seed_order
from cart_sweeps.schedule import branchable
from cart_sweeps.sweep.overrides import Arguments

SEED, D, R, STEPS = "seed", "model.d_model", "model.n_loops", "trainer.steps"
BRANCH_KEYS = ("trainer.keep_checkpoints_at", "trainer.branch_from", "trainer.branch_step")  # stage.branch sets


class Expanded(Protocol):
    """What the checks read of an expanded stage (sweep/expand.py's Stage)."""

    name: str
    spec: Any  # the composed stage group
    base: Any  # the stage's base config
    axes: dict[str, list[Any]]
    args: Arguments
    runs: list[Any]


def check(stage: Expanded) -> None:
    """Every option below, for `stage`."""
    check_seeds(stage)
    check_ladder(stage)


def adds(stage: Expanded) -> bool:
    return stage.spec.max_seeds is not None or stage.spec.replicates > 0


def check_seeds(stage: Expanded) -> None:
    """Refuse, in one line, options that cannot add seeds to this stage."""
    spec = stage.spec
    if spec.sentinels and (spec.select != "zoom" or spec.sentinels < 0):
        raise ConfigError(
            f"stage.sentinels={spec.sentinels} promotes configurations below the zoom's cutoff: it needs "
            f"stage.select=zoom and a count >= 0 (stage {stage.name} has select={spec.select})"
        )
    if spec.replicates < 0:
        raise ConfigError(f"stage.replicates={spec.replicates} must be >= 0 (configurations re-run per width)")
    if spec.max_seeds is not None and not spec.rungs:  # a ladder checks its own (sweep/ladder.py)
        if spec.replicates:
            raise ConfigError("stage.max_seeds and stage.replicates both add seeds: use one (replicates for a screen)")
        if SEED not in stage.axes or len(stage.axes.get(R, [])) < 2:
            raise ConfigError(
                f"stage.max_seeds adds seeds where the best R is undecided: stage {stage.name} needs a grid over "
                f"seed and over at least two {R} (it has {sorted(stage.axes)})"
            )
        grid = len(stage.axes[SEED])
        if not grid <= spec.max_seeds <= len(seed_order(stage.axes[SEED])):
            raise ConfigError(
                f"stage.max_seeds={spec.max_seeds} must lie between the grid's {grid} seeds and "
                f"{len(seed_order(stage.axes[SEED]))} (the seeds of the list in cart_sweeps.sweep.adaptive)"
            )
    if spec.replicates:
        if SEED in stage.axes or SEED in stage.args.passed:
            raise ConfigError(
                f"stage.replicates re-runs a one-seed screen with more seeds: stage {stage.name} already sets its "
                "seeds (drop seed=... or use stage.max_seeds)"
            )
        if D not in stage.axes:
            raise ConfigError(f"stage.replicates picks configurations per width: stage {stage.name} has no {D} axis")
    if adds(stage) and not stage.runs:
        raise ConfigError("stage.max_seeds and stage.replicates add seeds to a grid stage, not to a search")


def check_ladder(stage: Expanded) -> None:
    """Refuse, in one line, a ladder this stage cannot run."""
    spec = stage.spec
    if not spec.rungs:
        if spec.branch:
            raise ConfigError("stage.branch=true branches a ladder's rungs: set stage.rungs=[...] too")
        return
    rungs = list(spec.rungs)
    if len(rungs) < 2 or any(not isinstance(h, int) or h < 1 for h in rungs) or rungs != sorted(set(rungs)):
        raise ConfigError(f"stage.rungs={rungs} must be two or more increasing step counts (paper numbers)")
    if STEPS in spec.grid or STEPS in stage.args.passed or STEPS in stage.args.axes:
        raise ConfigError(f"stage.rungs sets each run's {STEPS}: drop {STEPS} from the grid and the command line")
    if not stage.runs:
        raise ConfigError("stage.rungs runs a grid, not a search")
    if len(stage.axes.get(SEED, [])) < 2:
        raise ConfigError(
            f"stage.rungs drops only what the rung's seed noise tells apart: stage {stage.name} needs a grid over at "
            "least two seeds (seed=42,137)"
        )
    if spec.max_seeds is not None and not len(stage.axes[SEED]) <= spec.max_seeds <= len(seed_order(stage.axes[SEED])):
        raise ConfigError(
            f"stage.max_seeds={spec.max_seeds} must lie between the grid's {len(stage.axes[SEED])} seeds and "
            f"{len(seed_order(stage.axes[SEED]))}"
        )
    if spec.drift is not None and not spec.drift >= 0:
        raise ConfigError(f"stage.drift={spec.drift} must be >= 0 (a gap's change per unit of ln(horizon))")
    if spec.branch:
        schedules = [run.config.cfg.trainer.schedule for run in stage.runs]
        if not (schedules and all(map(branchable, [*schedules, stage.spec.recipe.get("trainer.schedule")]))):
            raise ConfigError(
                "stage.branch=true continues each run's stable phase: it needs trainer.schedule: wsd in the stage "
                "file's recipe (a cosine spans each run's own length; the recipe's wsd warms every horizon up alike), "
                "or drop stage.branch"
            )
        if passed := [k for k in BRANCH_KEYS if k in stage.args.passed]:
            raise ConfigError(f"stage.branch=true sets each run's {passed[0]}: drop it from the command line")
