"""Peak dense bf16 FLOP/s of the GPUs the project reports MFU and GPU-hours against."""

from __future__ import annotations

# Vendor datasheets, dense tensor bf16, no sparsity; the RTX 3090 as the paper quotes it; H100/H200 SXM.
PEAK_BF16_FLOPS = {"rtx3090": 71e12, "rtx4090": 165e12, "a100": 312e12, "h100": 989e12, "h200": 989e12}


def peak_for_device_name(name: str) -> float | None:
    """The peak of a CUDA device by its name (e.g. 'NVIDIA H200'), or None for a GPU not in the table."""
    name = name.lower()
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key.removeprefix("rtx") in name), None)
