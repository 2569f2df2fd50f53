"""Where a run computes and in which precision."""

from __future__ import annotations

import torch

from cart_sweeps.config import ConfigError


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
