"""The GPUs (their peak FLOP/s, the devices nvidia-smi lists) and this machine as a stage is costed on."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass

# Vendor datasheets, dense tensor bf16, no sparsity; the RTX 3090 as the paper quotes it; H100/H200 SXM.
PEAK_BF16_FLOPS = {"rtx3090": 71e12, "rtx4090": 165e12, "a100": 312e12, "h100": 989e12, "h200": 989e12}


def peak_for_device_name(name: str) -> float | None:
    """The peak of a CUDA device by its name (e.g. 'NVIDIA H200'), or None for a GPU not in the table."""
    name = name.lower()
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key.removeprefix("rtx") in name), None)


def _nvidia_smi(*query: str) -> list[str] | None:
    """nvidia-smi's answer, a line per GPU (so the driver never imports torch nor opens CUDA)."""
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
    """This machine's NVIDIA devices: each GPU, or each of its MIG devices (memory: its profile's, 3g.40gb: 40 GB)."""
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


def cpu_flops_per_s(seconds: float = 0.2) -> float:
    """This machine's fp32 matrix-multiply FLOP/s, measured now (best of repeated 256^3 products for `seconds`)."""
    import numpy as np

    n = 256
    a = np.ones((n, n), dtype=np.float32)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        a @ a  # noqa: B018 - the product is what is timed
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / max(best, 1e-9)


@dataclass(frozen=True)
class Machine:
    """This machine as `plan` and preflight cost a stage on it: its GPU's dense bf16 peak, else its CPU's rate."""

    name: str
    peak_flops: float
    gpu: bool


def this_machine() -> Machine:
    for name in _nvidia_smi("--query-gpu=name", "--format=csv,noheader") or []:  # 'NVIDIA H200'
        if (peak := peak_for_device_name(name)) is not None:
            return Machine(name, peak, gpu=True)
    rate = cpu_flops_per_s()
    return Machine(f"this machine's CPU ({rate / 1e9:,.0f} GFLOP/s fp32, measured)", rate, gpu=False)


def machine_name() -> str:
    """This machine as its measured pace is cached under: its host, and its GPUs' names or its CPU's model and
    cores (a cluster's nodes of one kind may share a home folder, and differ)."""
    gpus = _nvidia_smi("--query-gpu=name", "--format=csv,noheader")
    return f"{socket.gethostname()} {'+'.join(gpus) if gpus else _cpu_model()} x{os.cpu_count()}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "cpu")
    except OSError:
        return "cpu"
