"""A branch's parent: the run folder a WSD run starts from (trainer.branch_from), checked before anything is
written to be the run whose first steps this one would have trained: the same model, data, seed and recipe up
to the branch step (docs/wsd.md), differing only in what shapes the decay after it or what is measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import AFTER_BRANCH, ConfigError, TrainerConfig, keys_with
from cart_sweeps.identity import GROUPS, group_identity
from cart_sweeps.record.runfolder import checkpoint_path
from cart_sweeps.schedule import Schedule, schedule_problem, stable_steps


@dataclass(frozen=True)
class Parent:
    run_dir: Path
    run_id: str
    step: int
    checkpoint: Path


def branch_parent(cfg: DictConfig) -> Parent | None:
    """The parent of a run with trainer.branch_from (None without), or one line on why it cannot be branched."""
    t = cfg.trainer
    if t.branch_from is None:
        return None
    folder = Path(t.branch_from)
    key = f"trainer.branch_from={folder}"
    try:
        saved = cast(DictConfig, OmegaConf.load(folder / "config.yaml"))
    except (OSError, ValueError) as err:
        why = type(err).__name__
        raise ConfigError(f"{key} holds no readable config.yaml ({why}); name a trained run's folder") from None
    parent = cast(DictConfig, OmegaConf.merge(OmegaConf.structured(TrainerConfig), saved.trainer))
    theirs = Schedule.of(parent)
    if not theirs.branchable:
        raise ConfigError(
            f"{key} trained under trainer.schedule={parent.schedule}: its learning rate followed a cosine over its "
            "own length, so its checkpoints equal no run of another length; branch a trainer.schedule=wsd run"
        )
    # By default the latest step both runs share: the earlier of the two decay starts (this run's as a wsd run's).
    ours = stable_steps(t.steps, t.decay_fraction)
    step = t.branch_step if t.branch_step is not None else min(theirs.decay_start, ours)
    if step > theirs.decay_start:
        raise ConfigError(
            f"trainer.branch_step={step} is after {folder.name}'s decay start (step {theirs.decay_start} of its "
            f"{parent.steps}): its state there has begun to decay; branch at or before step {theirs.decay_start}"
        )
    if problem := schedule_problem(t, [], step, branching=True):
        raise ConfigError(problem)
    if difference := _first_difference(cfg, saved):
        raise ConfigError(f"{key} is another run: {difference}; a branch continues its parent's model, data and recipe")
    path = checkpoint_path(folder, step)
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        kept = sorted(int(p.stem.removeprefix("step_")) for p in path.parent.glob("step_*.json"))
        raise ConfigError(
            f"{key} has no checkpoint at step {step} (it holds {kept or 'none'}); train the parent with "
            f"trainer.keep_checkpoints_at=[{step}], or branch from a step it holds"
        ) from None
    return Parent(folder, str(meta.get("run_id")), step, path)


def _first_difference(cfg: DictConfig, saved: DictConfig) -> str | None:
    """The first setting of what trains before the branch step in which `cfg` and the parent's config differ."""
    ours, theirs = _before_branch(cfg), _before_branch(saved)
    for key in sorted(ours.keys() | theirs.keys()):
        if ours.get(key) != theirs.get(key):
            return f"its {key} is {theirs.get(key)}, this run's {ours.get(key)}"
    return None


def _before_branch(cfg: DictConfig) -> dict[str, Any]:
    """What a run computes before its decay, flat (`model.d_model`, `trainer.lr`, `seed`, ...)."""
    out: dict[str, Any] = {"seed": cfg.seed}
    may_differ = keys_with(TrainerConfig, AFTER_BRANCH)  # shapes only the decay after the branch, or the evals
    for group in GROUPS:
        part = group_identity(group, cfg[group])
        out |= {f"{group}.{k}": v for k, v in part.items() if group != "trainer" or k not in may_differ}
    return out
