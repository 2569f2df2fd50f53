"""The paper's optimizer, bitsandbytes AdamW8bit, on this machine's CPU (bitsandbytes >= 0.50 has CPU kernels).

Its 20-step golden curve is in test_golden.py; here: where its 8-bit state engages, that a run keeps that
state in its checkpoints and resumes from them, and the one line where it cannot run.
"""

from __future__ import annotations

import pytest
import torch

from cart_sweeps.compose import compose_config
from cart_sweeps.model import build_model
from cart_sweeps.run import Trainer, execute
from cart_sweeps.train import checkpoint as ckpt
from cart_sweeps.train.eightbit import adamw8bit_problem
from cart_sweeps.train.setup import build_optimizer

bnb = pytest.importorskip("bitsandbytes")
CPU = torch.device("cpu")
# bitsandbytes keeps 32-bit state for a tensor of fewer elements than this (Optimizer8bit's min_8bit_size).
MIN_8BIT_SIZE = 4096
QUANT_STATE = "__bnb_optimizer_quant_state__"
EIGHT_BIT = {"state1": torch.uint8, "state2": torch.uint8, "absmax1": torch.float32, "qmap1": torch.float32}


def assert_state_by_size(named: dict[str, torch.Tensor], state: dict[str, dict]) -> None:
    """8-bit blockwise state for every tensor of >= MIN_8BIT_SIZE elements, fp32 state for the rest."""
    assert named and any(p.numel() >= MIN_8BIT_SIZE for p in named.values())
    for name, p in named.items():
        s = state[name]
        if p.numel() >= MIN_8BIT_SIZE:
            assert {k: s[k].dtype for k in EIGHT_BIT} == EIGHT_BIT, name
            assert s["state1"].shape == p.shape and s["absmax1"].numel() == -(-p.numel() // 256), name
        else:
            assert s["state1"].dtype == torch.float32 and "absmax1" not in s, name


def test_eight_bit_state_engages_on_the_papers_tensors():
    """The paper's d=256 CART (V=32,000): its embeddings and projections get 8-bit state, its gains and gates not."""
    cfg = compose_config(["model.d_model=256", "trainer.optimizer=adamw8bit"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = build_optimizer(model, cfg.trainer, CPU)
    assert type(optimizer) is bnb.optim.AdamW8bit
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    named = dict(model.named_parameters())
    assert_state_by_size(named, {name: optimizer.state[p] for name, p in named.items()})
    assert sum(p.numel() for p in named.values() if p.numel() >= MIN_8BIT_SIZE) > 0.99 * sum(
        p.numel() for p in named.values()
    )


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_tiny_run_keeps_eight_bit_state_in_its_checkpoint_and_resumes_from_it(tmp_path, data_cache):
    args = ["trainer.steps=4", "trainer.ckpt_every=2", "trainer.keep_final_optimizer=true"]  # to extend it
    args += ["trainer.warmup_steps=1"]  # scale=tiny's 5 would outlast the run
    cfg = compose_config(["scale=tiny", "trainer.optimizer=adamw8bit", *args])
    run_dir = tmp_path / "run"
    assert execute(cfg, run_dir).status == "completed"
    newest = ckpt.list_checkpoints(run_dir)[-1]
    saved = torch.load(newest, weights_only=True)
    assert saved["step"] == 4
    named = dict(build_model(cfg.model).named_parameters())
    # In parameter order; bitsandbytes' state_dict wraps each parameter's state in one key.
    by_name = {n: s[QUANT_STATE] for n, s in zip(named, saved["optimizer"]["state"].values(), strict=True)}
    assert_state_by_size(named, by_name)
    trainer = Trainer(cfg, run_dir)  # a relaunch: loads the newest checkpoint into a fresh AdamW8bit
    assert trainer._resume() == 4
    for p, s in zip(trainer.model.parameters(), by_name.values(), strict=True):
        assert all(torch.equal(trainer.optimizer.state[p][k], v) for k, v in s.items() if torch.is_tensor(v))


def test_where_adamw8bit_cannot_run_is_one_line():
    assert adamw8bit_problem(cuda=False) is None  # the pinned bitsandbytes has CPU kernels
    assert adamw8bit_problem(cuda=True, version="0.43.1") is None
    says = adamw8bit_problem(cuda=False, version="0.49.2")
    assert says is not None and "\n" not in says
    assert "bitsandbytes >= 0.50" in says and "0.49.2 is installed" in says and "trainer.optimizer=adamw" in says
