"""What training needs before its first step, built one way for the trainer and the bench (so a bench figure
is a figure of the real run): torch settings, device, precision, the seeded step-0 model, the paper's optimizer
(AdamW, or bitsandbytes AdamW8bit) and its schedule (`schedule.Schedule`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
from omegaconf import DictConfig
from torch import nn

from cart_sweeps.config import ConfigError, TrainerConfig
from cart_sweeps.model import build_model
from cart_sweeps.schedule import Schedule
from cart_sweeps.train.eightbit import adamw8bit_problem

if TYPE_CHECKING:
    from cart_sweeps.model import LanguageModel


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA GPU is visible; use trainer.device=auto or cpu")
    return torch.device(name)


def amp_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA by default (the paper); fp32 on the CPU unless bf16 is asked for."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


class Runtime(NamedTuple):
    """Where a run computes: the device and the autocast dtype (None: fp32)."""

    device: torch.device
    amp: torch.dtype | None


def configure_torch(cfg: DictConfig) -> Runtime:
    t = cfg.trainer
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    if t.deterministic:
        torch.use_deterministic_algorithms(True)
    device = pick_device(t.device)
    return Runtime(device, amp_dtype(t.precision, device))


# A run compiles (trainer.compile null) when it is long enough to repay it: on 2 CPU cores (issue 26) compiling
# takes 22-32 s per shape and saves 8-35% of a step, paying after ~300-1,100 steps.
COMPILE_MIN_STEPS = 1000


def compiles(cfg: DictConfig, device: torch.device) -> bool:
    """trainer.compile, where null means: when the run has at least COMPILE_MIN_STEPS steps."""
    return cfg.trainer.steps >= COMPILE_MIN_STEPS if cfg.trainer.compile is None else cfg.trainer.compile


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


class TrainState(NamedTuple):
    """The step-0 model (`forward` is its compiled form where compiling), optimizer and schedule."""

    model: LanguageModel
    forward: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR


def build_state(cfg: DictConfig, device: torch.device) -> TrainState:
    torch.manual_seed(cfg.seed)  # seeds change only the init; the data order is fixed
    model = build_model(cfg.model).to(device)
    # torch.compile of a Module returns an OptimizedModule (a Module); its annotation says only Callable.
    forward = cast(nn.Module, torch.compile(model, fullgraph=True)) if compiles(cfg, device) else model
    optimizer = build_optimizer(model, cfg.trainer, device)
    return TrainState(model, forward, optimizer, build_scheduler(optimizer, cfg.trainer))
