"""The learning-rate schedule as plain arithmetic: the trainer steps by it and the analysis replays it.

Torch-free, so the analysis (which predicts the gate's drift under weight decay from the schedule) imports
the one definition the runs trained with.
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


def lr_at(step: int, t: Schedule) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, cosine to min_lr at the end.

    The cosine spans the run's own length (`t.steps`), as in the paper: a 3,000-step Stage-1 run
    anneals fully, it is not a prefix of a 30,500-step schedule.
    """
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1 + math.cos(math.pi * progress))
