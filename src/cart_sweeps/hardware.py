"""Peak dense bf16 FLOP/s of the GPUs the project reports MFU and GPU-hours against."""

from __future__ import annotations

import subprocess

# Vendor datasheets, dense tensor bf16, no sparsity; the RTX 3090 as the paper quotes it; H100/H200 SXM.
PEAK_BF16_FLOPS = {"rtx3090": 71e12, "rtx4090": 165e12, "a100": 312e12, "h100": 989e12, "h200": 989e12}


def peak_for_device_name(name: str) -> float | None:
    """The peak of a CUDA device by its name (e.g. 'NVIDIA H200'), or None for a GPU not in the table."""
    name = name.lower()
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key.removeprefix("rtx") in name), None)


def _nvidia_smi(*query: str) -> list[str] | None:
    """nvidia-smi's answer, a line per GPU (the driver asks it, so it never imports torch nor opens CUDA)."""
    try:
        out = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else None


def gpu_memory_bytes(gpu: str) -> int | None:
    """Total memory of GPU `gpu` (an index or a UUID); None without nvidia-smi or for an id it does not know."""
    lines = _nvidia_smi("--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", str(gpu))
    try:
        return int(lines[0]) * 2**20 if lines else None
    except ValueError:
        return None


def nvidia_gpus() -> list[str]:
    """The indices of this machine's NVIDIA GPUs (none without nvidia-smi)."""
    return _nvidia_smi("--query-gpu=index", "--format=csv,noheader") or []
