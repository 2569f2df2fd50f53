"""The learning-rate schedule as one record, torch-free: the trainer steps by it, the checks and the analysis
replay it.

Every schedule is warm-up-stable-decay, as torchtitan's: a linear warm-up, the peak held until the decay start,
then a fall of one shape (Decay) to min_lr. `cosine` (the paper's) has no stable phase, so runs of two lengths
differ after the warm-up; `wsd` (Hägele et al. 2024) holds the peak until the last `decay_fraction`, so runs of
any length share every step before the shorter one's decay and one branches from another (docs/wsd.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Protocol


class LRSchedule(StrEnum):
    cosine = "cosine"  # the paper's: warm-up, then a cosine over the run's own length
    wsd = "wsd"  # warm-up, constant, then a decay over the last trainer.decay_fraction: branchable (docs/wsd.md)

    @property
    def branchable(self) -> bool:  # runs of two lengths share every step before the shorter one's decay
        return self is LRSchedule.wsd


def branchable(name: object) -> bool:
    """Of a value as written (an override, a stage file's recipe); no schedule's name is left to validation."""
    return isinstance(name, str) and name in LRSchedule.__members__ and LRSchedule(name).branchable


class DecayShape(StrEnum):
    """trainer.decay_shape: how a WSD run's decay falls in its progress p from 0 to 1."""

    sqrt = "sqrt"  # lr falls as 1 - sqrt(p): the paper's better cooldown
    linear = "linear"  # lr falls as 1 - p


class Decay(Enum):
    """The learning rate from the peak to min_lr in the decay's progress p (0 to 1)."""

    cosine = "cosine"  # the cosine schedule's: a half cosine, flat at min_lr past its end
    sqrt = "sqrt"
    linear = "linear"

    def lr(self, peak: float, floor: float, p: float) -> float:
        if self is Decay.cosine:
            return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * min(1.0, p)))
        fall = math.sqrt(p) if self is Decay.sqrt else p
        return floor + (peak - floor) * (1 - fall)


class Recipe(Protocol):
    """What the schedule reads of a recipe (a TrainerConfig, or the analysis's Recipe)."""

    @property
    def steps(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def min_lr(self) -> float: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def schedule(self) -> str: ...
    @property
    def decay_fraction(self) -> float: ...
    @property
    def decay_shape(self) -> str: ...


@dataclass(frozen=True)
class Schedule:
    """One run's schedule: warm-up to `lr` over `warmup_steps`, `lr` until `decay_start`, then `decay` from `lr`
    at step `origin` to `min_lr` at step `end` (a cosine reaches it one step past the run's last, a WSD decay at
    its last step)."""

    name: LRSchedule
    lr: float
    min_lr: float
    warmup_steps: int
    decay_start: int  # the step its decay begins at; a WSD run's last checkpoint shared with longer runs
    decay: Decay
    origin: int
    end: int

    @classmethod
    def of(cls, t: Recipe) -> Schedule:
        name, steps, warmup = LRSchedule(t.schedule), t.steps, t.warmup_steps
        if name.branchable:
            start = stable_steps(steps, t.decay_fraction)
            return cls(name, t.lr, t.min_lr, warmup, start, Decay(t.decay_shape), start - 1, steps - 1)
        return cls(name, t.lr, t.min_lr, warmup, warmup, Decay.cosine, warmup, max(warmup + 1, steps))

    @property
    def branchable(self) -> bool:
        return self.name.branchable

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if step < self.decay_start:
            return self.lr
        return self.decay.lr(self.lr, self.min_lr, (step - self.origin) / (self.end - self.origin))


def stable_steps(steps: int, decay_fraction: float) -> int:
    """The decay start of a WSD run of `steps` steps (rounded): the last step every longer run of the recipe shares."""
    return steps - round(decay_fraction * steps)


_COSINE_BRANCH = (
    "the cosine spans a run's own length, so a parent's learning rate before step {n} already differs from a "
    "fresh {steps}-step run's, and a branch would equal no run; use trainer.schedule=wsd (docs/wsd.md)"
)


def schedule_problem(t: Recipe, keep_at: list[int], branch_step: int | None, branching: bool) -> str | None:
    """One line for a schedule or branch setting that cannot do what it says, or None. `keep_at`:
    trainer.keep_checkpoints_at; `branching`: whether trainer.branch_from is set (the parent's checks: record.branch).
    """
    if t.decay_fraction > 1:
        return f"trainer.decay_fraction={t.decay_fraction} must be <= 1 (the share of the run's steps that decay)"
    s = Schedule.of(t)
    if s.branchable and t.warmup_steps > s.decay_start:
        return (
            f"trainer.warmup_steps={t.warmup_steps} must be <= the decay start, step {s.decay_start} "
            f"(trainer.steps={t.steps} less trainer.decay_fraction={t.decay_fraction} of them); lower one of them"
        )
    if late := [step for step in keep_at if not 1 <= step <= t.steps]:
        return f"trainer.keep_checkpoints_at={list(keep_at)}: step {late[0]} is not in 1..trainer.steps={t.steps}"
    if branch_step is not None and not branching:
        return f"trainer.branch_step={branch_step} needs the parent run: trainer.branch_from=<run folder>"
    if not branching:
        return None
    if not s.branchable:
        n = branch_step if branch_step is not None else "N"
        return f"trainer.branch_from under trainer.schedule={t.schedule}: " + _COSINE_BRANCH.format(n=n, steps=t.steps)
    if branch_step is not None and branch_step > s.decay_start:
        return (
            f"trainer.branch_step={branch_step} is after this run's decay start, step {s.decay_start} of "
            f"trainer.steps={t.steps}: a fresh run decays from there, so the branch would equal no run; "
            "branch at or before it"
        )
    return None
