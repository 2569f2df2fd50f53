"""Peak dense bf16 FLOP/s of the GPUs the project reports MFU and GPU-hours against."""

from __future__ import annotations

import subprocess

# Vendor datasheets, dense tensor bf16, no sparsity; the RTX 3090 as the paper quotes it; H100/H200 SXM.
PEAK_BF16_FLOPS = {"rtx3090": 71e12, "rtx4090": 165e12, "a100": 312e12, "h100": 989e12, "h200": 989e12}


def peak_for_device_name(name: str) -> float | None:
    """The peak of a CUDA device by its name (e.g. 'NVIDIA H200'), or None for a GPU not in the table."""
    name = name.lower()
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key.removeprefix("rtx") in name), None)


def gpu_memory_bytes(gpu: int) -> int | None:
    """Total memory of GPU `gpu` from nvidia-smi (the driver must not open a CUDA context); None without it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", str(gpu)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return int(out.stdout.strip()) * 2**20 if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
