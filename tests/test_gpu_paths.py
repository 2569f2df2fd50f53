"""A GPU run's own code paths, run on the CPU where torch allows, each against its eager fp32 twin:
torch.compile (inductor's CPU backend), bf16 autocast with the chunked loss, the device-side finiteness check.

Tolerances, from what was measured here (tiny CART, the golden run's recipe):
- bf16 autocast, one step from the same weights: loss within rtol 2e-3, grad norm within rtol 2e-2
  (measured: 8e-6 and 3e-4; bf16 keeps 8 bits of mantissa, so the margin is for other CPUs' kernels).
- compiled bf16 AdamW8bit over the golden 20 steps, against the golden AdamW8bit curve (eager fp32): each
  step's loss within rtol 1e-2, each eval PPL within 5% (measured: 8e-5 and 3e-4). Compiled fp32 AdamW
  matched the AdamW golden curve to 4 decimals as well, but a compile costs minutes on 2 busy cores (1.5
  with inductor's cache warm): one is run here.
- a loss that stops being finite is caught at the same step, compiled bf16 or eager fp32.
CUDA-only parts (fused AdamW, MFU, peak memory) stay in test_cuda.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from cart_sweeps.compose import compose_config
from cart_sweeps.model import build_model
from cart_sweeps.run import execute
from cart_sweeps.train.loop import train_step
from cart_sweeps.train.setup import build_optimizer

_spec = importlib.util.spec_from_file_location("golden_make", Path(__file__).parent / "fixtures/golden/make.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

COMPILED_BF16 = ["trainer.compile=true", "trainer.precision=bf16"]


def _one_step(amp: torch.dtype | None) -> tuple[float, float]:
    """Loss and grad norm of one training step of tiny CART from its seeded init, on fixed tokens."""
    cfg = compose_config(["scale=tiny"])
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    tokens = torch.randint(0, cfg.model.vocab_size, (4, 65), generator=torch.Generator().manual_seed(0))
    optimizer = build_optimizer(model, cfg.trainer, torch.device("cpu"))
    loss, grad_norm = train_step(model, optimizer, [(tokens[:, :-1], tokens[:, 1:])], 1, amp, 1.0)
    return loss.item(), grad_norm.item()


def test_bf16_autocast_with_the_chunked_loss_tracks_fp32():
    (loss, norm), (loss32, norm32) = _one_step(torch.bfloat16), _one_step(None)
    assert math.isclose(loss, loss32, rel_tol=2e-3) and loss != loss32  # bf16 did run
    assert math.isclose(norm, norm32, rel_tol=2e-2)


def _rows(run_dir: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == kind]


@pytest.fixture
def torch_settings_kept():
    """The golden recipe sets torch's threads and determinism in this process: restored afterwards."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


@pytest.mark.slow  # one compile of the tiny model: a minute or more on 2 cores
def test_compiled_bf16_adamw8bit_run_tracks_its_eager_fp32_twin(tmp_path, data_cache, torch_settings_kept):
    path, overrides = golden.CURVES["train_adamw8bit"]
    twin = json.loads(path.read_text())  # the eager fp32 run, as the golden test holds it
    summary = execute(compose_config([*overrides, *COMPILED_BF16]), tmp_path / "run")
    assert summary.status == "completed" and summary.details["env"]["packages"]["bitsandbytes"]
    losses = [
        (row["loss"], ref["loss"]) for row, ref in zip(_rows(tmp_path / "run", "train"), twin["train"], strict=True)
    ]
    assert all(math.isclose(a, b, rel_tol=1e-2) for a, b in losses), losses
    evals = zip(_rows(tmp_path / "run", "eval"), twin["eval"], strict=True)
    ppls = [(row[k], ref[k]) for row, ref in evals for k in ref if k.startswith("ppl_")]
    assert len(ppls) == 6 and all(math.isclose(a, b, rel_tol=0.05) for a, b in ppls), ppls

    # The finiteness check reads the compiled run's loss on the device: the same step as eager fp32.
    diverging = [*overrides, "trainer.lr=1e6", "trainer.steps=5", "trainer.warmup_steps=1"]
    eager = execute(compose_config(diverging), tmp_path / "eager")
    compiled = execute(compose_config([*diverging, *COMPILED_BF16]), tmp_path / "compiled")
    assert eager.status == compiled.status == "diverged"
    assert eager.error is not None and compiled.error is not None
    assert eager.error.split(" at step ")[1] == compiled.error.split(" at step ")[1]
