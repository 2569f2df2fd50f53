"""The paper's optimiser and schedule: AdamW (or bitsandbytes AdamW8bit), and `schedule.Schedule`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from cart_sweeps.config import ConfigError, TrainerConfig
from cart_sweeps.schedule import Schedule
from cart_sweeps.train.eightbit import adamw8bit_problem

if TYPE_CHECKING:
    from cart_sweeps.model import LanguageModel


def param_groups(model: LanguageModel, t: TrainerConfig) -> list[dict]:
    """Weight decay on every parameter (the paper), or all but the model's no-decay set (corrected)."""
    params = dict(model.named_parameters())
    if t.decay_all:
        return [{"params": list(params.values()), "weight_decay": t.weight_decay, "names": list(params)}]
    spared = model.no_decay_names()
    decayed = [n for n in params if n not in spared]
    kept = [n for n in params if n in spared]
    return [
        {"params": [params[n] for n in decayed], "weight_decay": t.weight_decay, "names": decayed},
        {"params": [params[n] for n in kept], "weight_decay": 0.0, "names": kept},
    ]


def build_optimizer(model: LanguageModel, t: TrainerConfig, device: torch.device) -> torch.optim.Optimizer:
    groups = param_groups(model, t)
    kwargs: dict[str, Any] = {"lr": t.lr, "betas": tuple(t.betas)}
    if t.optimizer == "adamw8bit":
        if problem := adamw8bit_problem(cuda=device.type == "cuda"):
            raise ConfigError(problem)
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(groups, **kwargs)
    return torch.optim.AdamW(groups, fused=True, **kwargs)  # one kernel per step, on CUDA and (torch >= 2.4) the CPU


def build_scheduler(optimizer: torch.optim.Optimizer, t: TrainerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    schedule = Schedule.of(t)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule.lr_at(step) / schedule.lr)
