"""`make gpu-check` (python -m cart_sweeps.gpu_check): the GPU hot path measured within 8 minutes: the CUDA tests,
CART's bench at the paper's shape beside its RTX 3090 figures, and a two-run stage packed onto one GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch

from cart_sweeps.bench import bench
from cart_sweeps.config import REPO_ROOT

BUDGET_S = 8 * 60
WIDTHS = (256, 512, 768, 1024)
PAPER_SHAPE = (
    "model.n_prelude=6 model.n_loops=6 trainer.seq_len=1024 trainer.micro_batch_size=8 trainer.grad_accum=4 "
    "bench.warmup=3 bench.steps=10"
).split()
# REFERENCE.md section 4: tokens/s of CART at R=6 on one RTX 3090; MFU quoted at the two ends only.
PAPER_RTX3090_TOKENS_PER_S = {256: 134_985, 512: 71_244, 768: 45_556, 1024: 32_393}
PAPER_RTX3090_MFU = {256: 0.20, 1024: 0.49}
TWO_RUN_STAGE = (
    "stage=1 scale=tiny model.d_model=256 model.n_prelude=2 model.n_loops=2,4 launcher.runs_per_gpu=2".split()
)


def _elapsed(start: float) -> float:
    return time.perf_counter() - start


def _step(title: str, cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> bool:
    print(f"\n== {title}: {' '.join(cmd)}", flush=True)
    try:
        return subprocess.run(cmd, cwd=REPO_ROOT, timeout=max(timeout, 1), env=env).returncode == 0
    except subprocess.TimeoutExpired:
        print(f"{title}: stopped after {timeout:.0f} s (the check's 8-minute budget)")
        return False


def _bench_table(deadline: float) -> bool:
    """Bench each width without and with compile; one row each, beside the paper's 3090 figures."""
    header = f"{'d':>5} {'compile':>7} {'tokens/s':>10} {'ms/step':>8} {'MFU':>6} {'peak GiB':>8}"
    print(f"\n== bench: CART P=6 R=6, sequence 1,024, batch 8 x 4, bf16 on {torch.cuda.get_device_name()}")
    print(f"{header}   paper 3090: tokens/s  MFU", flush=True)
    for d in WIDTHS:
        for compiled in (False, True):
            if time.perf_counter() > deadline:
                print(f"{d:>5} {compiled!s:>7}  skipped: the bench's share of the 8 minutes is spent")
                continue
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            r = bench([f"model.d_model={d}", f"trainer.compile={str(compiled).lower()}", *PAPER_SHAPE])
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
            paper_mfu = f"{PAPER_RTX3090_MFU[d]:.0%}" if d in PAPER_RTX3090_MFU else "-"
            print(
                f"{d:>5} {compiled!s:>7} {r['tokens_per_s']:>10,.0f} {r['ms_per_step']:>8.1f} {mfu:>6} "
                f"{r['peak_mem_mb'] / 1024:>8.2f}   {PAPER_RTX3090_TOKENS_PER_S[d]:>20,} {paper_mfu:>4}",
                flush=True,
            )
    return True


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU is visible on this machine; run `make gpu-check` on a machine with one")
        return 1
    start = time.perf_counter()
    ok = _step("CUDA tests", [sys.executable, "-m", "pytest", "-q", "tests/test_cuda.py"], 150)
    ok &= _bench_table(deadline=start + 6 * 60)
    with tempfile.TemporaryDirectory() as runs:
        env = {**os.environ, "CART_SWEEPS_RUNS": runs}
        stage = [sys.executable, "-m", "cart_sweeps", "-m", *TWO_RUN_STAGE]
        ok &= _step("two runs on one GPU", stage, BUDGET_S - _elapsed(start), env)
    print(f"\ngpu-check: {'passed' if ok else 'FAILED'} in {_elapsed(start):.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
