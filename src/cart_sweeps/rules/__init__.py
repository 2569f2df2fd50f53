"""What decides what a stage runs next and what it concludes: the statistics, the seed rule, the ladder, zoom
and the axes they read (docs/extending.md adds a stage kind here)."""

from __future__ import annotations

from dataclasses import fields

from cart_sweeps.config import StageConfig
from cart_sweeps.entry import load
from cart_sweeps.rules.rule import Expanded, StageRule
from cart_sweeps.rules.seeds import SeedRule

KINDS = tuple((f.name, f.metadata["rule"]) for f in fields(StageConfig) if "rule" in f.metadata)


def for_stage(stage: Expanded) -> StageRule:
    """The stage's rule: the first `StageConfig` field with `metadata=rule(...)` it sets names its class (the
    ladder's `rungs`), else the seed rule."""
    chosen = next((path for key, path in KINDS if stage.spec[key]), None)
    return (load(chosen, "stage rule") if chosen else SeedRule)(stage)
