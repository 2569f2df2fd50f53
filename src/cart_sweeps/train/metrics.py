"""The run folder's metric record written (metrics.jsonl; read by cart_sweeps.record.metrics), throughput/MFU
figures and the environment."""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from cart_sweeps.config import REPO_ROOT
from cart_sweeps.hardware import peak_for_device_name
from cart_sweeps.record.metrics import read_metrics
from cart_sweeps.record.runfolder import RUNS_AT_ONCE, atomic_write

# The packages whose versions a run records (bitsandbytes: AdamW8bit's kernels).
PACKAGES = "torch bitsandbytes hydra-core optuna submitit wandb datasets tokenizers cart_sweeps".split()


class MetricsLog:
    """Append-only JSON lines, one object per logged event; on resume, rows past the checkpoint's step (logged
    again, identically, by the resumed process) and lines that do not parse are dropped. `rows`: those kept."""

    def __init__(self, path: Path, resume_step: int) -> None:
        self.path = path
        self.rows = [row for row in read_metrics(path) if row["step"] <= resume_step]
        atomic_write(path, lambda tmp: tmp.write_text("".join(json.dumps(row) + "\n" for row in self.rows)))

    def write(self, row: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def mfu(tokens_per_s: float, flops_per_token: float, device: torch.device) -> float | None:
    """Against the device's dense bf16 peak; None where MFU is not meaningful (CPU, unknown GPU)."""
    peak = peak_for_device_name(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return None if peak is None else tokens_per_s * flops_per_token / peak


def peak_mem_mb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def environment(device: torch.device) -> dict[str, Any]:
    """What produced a run: code version, packages, hardware, and the GPU its launcher gave it."""
    return {
        **software(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "host": platform.node(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cpu_cores": os.cpu_count(),
        "runs_at_once": int(os.environ.get(RUNS_AT_ONCE, "1")),  # beside it on these cores (or its GPU)
    }


@functools.cache
def software() -> dict[str, Any]:
    """The code version (`git`) and package versions, read once per process (a warm worker's forks inherit them)."""
    try:
        sha = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        sha = None
    return {"git_sha": sha, "python": platform.python_version(), "packages": {n: _version(n) for n in PACKAGES}}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
