"""The GPUs: the peak FLOP/s MFU and GPU-hours are reported against, and the devices nvidia-smi lists."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Gpu:
    """A device a run can be given: `id` is what CUDA_VISIBLE_DEVICES takes (a GPU's index, a MIG device's UUID)."""

    id: str
    uuid: str
    memory_bytes: int | None


# `nvidia-smi -L`: "GPU 0: NVIDIA H100 (UUID: GPU-...)", then its MIG devices "  MIG 3g.40gb Device 0: (UUID: MIG-...)".
_GPU_LINE = re.compile(r"GPU (\d+): .*\(UUID: (GPU-[^)]+)\)")
_MIG_LINE = re.compile(r"MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)")
_MIG_MEMORY = re.compile(r"\.(\d+)gb$")  # a MIG profile names its memory: 3g.40gb


def nvidia_gpus() -> list[Gpu]:
    """This machine's NVIDIA devices: each GPU, or each of its MIG devices where it is split (none without
    nvidia-smi). A GPU's memory is nvidia-smi's; a MIG device's is its profile's (3g.40gb: 40 GB)."""
    memory: dict[str, int | None] = {}
    for line in _nvidia_smi("--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits") or []:
        index, _, mib = (part.strip() for part in line.split(","))
        memory[index] = int(mib) * 2**20 if mib.isdigit() else None
    gpus: list[tuple[Gpu, list[Gpu]]] = []  # each GPU with its MIG devices
    for line in _nvidia_smi("-L") or []:
        if gpu := _GPU_LINE.match(line):
            gpus.append((Gpu(gpu[1], gpu[2], memory.get(gpu[1])), []))
        elif (mig := _MIG_LINE.match(line)) and gpus:
            gb = _MIG_MEMORY.search(mig[1])
            gpus[-1][1].append(Gpu(mig[2], mig[2], int(gb[1]) * 10**9 if gb else None))
    return [device for gpu, migs in gpus for device in (migs or [gpu])]


def gpu_memory_bytes(ids: list[str]) -> list[int | None]:
    """Total memory of each of `ids` (indices, GPU UUIDs, MIG UUIDs); None for an id nvidia-smi does not list."""
    memory = {key: gpu.memory_bytes for gpu in nvidia_gpus() for key in (gpu.id, gpu.uuid)}
    return [memory.get(gpu) for gpu in ids]
