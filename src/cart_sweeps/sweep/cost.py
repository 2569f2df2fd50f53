"""What a run costs before it runs: parameters, training tokens and FLOPs, GPU-hours at an assumed MFU."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from cart_sweeps.config import ConfigError
from cart_sweeps.hardware import PEAK_BF16_FLOPS
from cart_sweeps.model import param_counts, train_flops_per_token


@dataclass(frozen=True)
class Cost:
    params_stored: int
    params_effective: int
    tokens: int  # training tokens (0 for an evaluation)
    flops: float  # training FLOPs
    gpu_hours: float


def peak_flops(gpu: str, mfu: float) -> float:
    """Sustained FLOP/s: the GPU's peak times the assumed MFU."""
    if gpu not in PEAK_BF16_FLOPS:
        raise ConfigError(f"plan.gpu={gpu!r} is not allowed; use one of {sorted(PEAK_BF16_FLOPS)}")
    if not 0 < mfu <= 1:
        raise ConfigError(f"plan.mfu={mfu} must be in (0, 1]")
    return PEAK_BF16_FLOPS[gpu] * mfu


def run_cost(cfg: DictConfig, flops_per_s: float) -> Cost:
    counts = param_counts(cfg.model)
    t = cfg.trainer
    tokens = t.steps * t.micro_batch_size * t.grad_accum * t.seq_len if cfg.stage.kind == "train" else 0
    flops = train_flops_per_token(cfg.model, t.seq_len) * tokens
    return Cost(counts["stored"], counts["effective"], tokens, flops, flops / flops_per_s / 3600)
