"""The learning-rate schedule as plain arithmetic: the trainer steps by it and the analysis replays it.

Torch-free, so the analysis (which predicts the gate's drift under weight decay from the schedule) imports
the one definition the runs trained with.

Two schedules. `cosine` (the paper's) spans each run's own length, so runs of two lengths differ from their
first step after the warm-up. `wsd` (warm-up, stable, decay; Hägele et al. 2024) holds the peak until the
last `decay_fraction` of the run: runs of any length share every step before the shorter one's decay, so a
longer run's checkpoint there is the shorter run's too, and a run branched from it (docs/wsd.md) computes
what a fresh run of its length computes.
"""

from __future__ import annotations

import math
from typing import Protocol


class Schedule(Protocol):
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


def decay_start(t: Schedule) -> int:
    """The number of steps a WSD run trains at its peak (warm-up included) before its decay: steps less
    decay_fraction of them (rounded to the nearest step). Its checkpoint at this step is the last one
    every run of the recipe at least this long shares."""
    return stable_steps(t.steps, t.decay_fraction)


def stable_steps(steps: int, decay_fraction: float) -> int:
    """`decay_start` of a WSD run of `steps` steps (what a ladder's plan and simulation cost a branch by)."""
    return steps - round(decay_fraction * steps)


def lr_at(step: int, t: Schedule) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then the schedule's fall to min_lr.

    cosine: over the run's own length (`t.steps`), as in the paper: a 3,000-step Stage-1 run anneals fully,
    it is not a prefix of a 30,500-step schedule. wsd: constant until `decay_start`, then falling over the
    remaining steps to min_lr at the last one, as 1 - sqrt(p) or 1 - p of the decay's progress p.
    """
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    if t.schedule == "wsd":
        start = decay_start(t)
        if step < start:
            return t.lr
        progress = (step - start + 1) / (t.steps - start)
        fall = math.sqrt(progress) if t.decay_shape == "sqrt" else progress
        return t.min_lr + (t.lr - t.min_lr) * (1 - fall)
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1 + math.cos(math.pi * progress))


_COSINE_BRANCH = (
    "the cosine spans a run's own length, so a parent's learning rate before step {n} already differs from a "
    "fresh {steps}-step run's, and a branch would equal no run; use trainer.schedule=wsd (docs/wsd.md)"
)


def schedule_problem(t: Schedule, keep_at: list[int], branch_step: int | None, branching: bool) -> str | None:
    """One line for a schedule or branch setting that cannot do what it says (checked before any launch), or None.

    `keep_at`: trainer.keep_checkpoints_at; `branch_step`/`branching`: trainer.branch_step and whether
    trainer.branch_from is set. The parent's own checks (its checkpoint, its recipe) are record.branch's.
    """
    if t.decay_fraction > 1:
        return f"trainer.decay_fraction={t.decay_fraction} must be <= 1 (the share of the run's steps that decay)"
    if t.schedule == "wsd" and t.warmup_steps > decay_start(t):
        return (
            f"trainer.warmup_steps={t.warmup_steps} must be <= the decay start, step {decay_start(t)} "
            f"(trainer.steps={t.steps} less trainer.decay_fraction={t.decay_fraction} of them); lower one of them"
        )
    if late := [s for s in keep_at if not 1 <= s <= t.steps]:
        return f"trainer.keep_checkpoints_at={list(keep_at)}: step {late[0]} is not in 1..trainer.steps={t.steps}"
    if branch_step is not None and not branching:
        return f"trainer.branch_step={branch_step} needs the parent run: trainer.branch_from=<run folder>"
    if not branching:
        return None
    if t.schedule != "wsd":
        n = branch_step if branch_step is not None else "N"
        return f"trainer.branch_from under trainer.schedule={t.schedule}: " + _COSINE_BRANCH.format(n=n, steps=t.steps)
    if branch_step is not None and branch_step > decay_start(t):
        return (
            f"trainer.branch_step={branch_step} is after this run's decay start, step {decay_start(t)} of "
            f"trainer.steps={t.steps}: a fresh run decays from there, so the branch would equal no run; "
            "branch at or before it"
        )
    return None
