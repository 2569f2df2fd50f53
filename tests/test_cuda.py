"""What only CUDA has (fused AdamW, MFU, peak memory, bitsandbytes' CUDA kernels): run on a GPU, skipped cleanly
without. The rest of the GPU run's path (compile, bf16 autocast, AdamW8bit) runs on the CPU in test_gpu_paths.py
and test_adamw8bit.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cart_sweeps.bench import bench
from cart_sweeps.compose import compose_config
from cart_sweeps.model import build_model
from cart_sweeps.train.setup import build_optimizer


def needs_gpu(test):
    """Marked `cuda`, and skipped with one line where no GPU is visible."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
    return pytest.mark.cuda(skip(test))


@needs_gpu
def test_bench_on_the_gpu_runs_bf16_and_reports_mfu():
    result = bench(["scale=tiny", "trainer.device=cuda", "bench.warmup=2", "bench.steps=3"])
    assert result["dtype"] == "bfloat16" and result["peak_mem_mb"] > 0
    if any(k in result["device"].lower() for k in ("3090", "4090", "a100", "h100", "h200")):
        assert 0 < result["mfu"] < 1


@needs_gpu
def test_adamw_on_the_gpu_is_fused():
    cfg = compose_config(["scale=tiny"])
    optimizer = build_optimizer(build_model(cfg.model).cuda(), cfg.trainer, torch.device("cuda"))
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"]


@needs_gpu
def test_adamw8bit_builds_on_the_gpu():
    pytest.importorskip("bitsandbytes")
    cfg = compose_config(["scale=tiny", "trainer.optimizer=adamw8bit"])
    optimizer = build_optimizer(build_model(cfg.model).cuda(), cfg.trainer, torch.device("cuda"))
    assert type(optimizer).__name__ == "AdamW8bit"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of make gpu-check")
def test_gpu_check_on_a_cpu_machine_is_one_clear_line():
    proc = subprocess.run([sys.executable, "-m", "cart_sweeps.gpu_check"], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr == ""
    assert proc.stdout.count("\n") == 1 and "no CUDA GPU" in proc.stdout
