"""A branch's parent: the run folder a WSD run starts from (trainer.branch_from), checked before anything is
written to be the run whose first steps this one would have trained: the same model, data, seed and recipe up
to the branch step (docs/wsd.md), differing only in what shapes the decay after it or what is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import AFTER_BRANCH, ConfigError, TrainerConfig, keys_with
from cart_sweeps.data.hashes import stored_sha256
from cart_sweeps.identity import GROUPS, group_identity, run_id
from cart_sweeps.record.runfolder import CONFIG, checkpoint_path, read_meta
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
        saved = cast(DictConfig, OmegaConf.load(folder / CONFIG))
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
    if problem := checkpoint_problem(folder, step, run_id(saved)):
        raise ConfigError(f"{key} {problem}")
    return Parent(folder, run_id(saved), step, checkpoint_path(folder, step))


def checkpoint_problem(folder: Path, step: int, parent_id: str) -> str | None:
    """Why the run in `folder` (`parent_id`) holds no checkpoint at `step` that a branch may start from, with the fix
    (None: it holds one): none kept there, or one that is not what the run saved there (another run's, or bytes
    that no longer match the sha256 its meta recorded), checked as a resume checks its own."""
    path = checkpoint_path(folder, step)
    try:
        meta = read_meta(path)
        digest = stored_sha256(path)
    except (OSError, ValueError):
        kept = sorted(int(p.stem.removeprefix("step_")) for p in path.parent.glob("step_*.json"))
        return (
            f"has no checkpoint at step {step} (it holds {kept or 'none'}); train the parent with "
            f"trainer.keep_checkpoints_at=[{step}], or branch from a step it holds"
        )
    if meta.get("run_id") != parent_id:
        why = f"another run's ({meta.get('run_id')}), not its own ({parent_id})"
    elif digest != meta.get("sha256"):
        why = "damaged or replaced: its bytes no longer match the sha256 it was saved with"
    else:
        return None
    return (
        f"holds at step {step} a checkpoint that is {why}; train this run fresh instead (drop trainer.branch_from: "
        f"a branch equals the fresh run of its length), or retrain the parent with trainer.keep_checkpoints_at=[{step}]"
    )


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
