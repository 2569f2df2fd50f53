"""The models against REFERENCE.md section 1: counts, causality, init, variable R, validation."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest
import torch

from cart_sweeps.config import ABLATION_SWITCHES, ConfigError, ModelConfig
from cart_sweeps.model import build_model, dense_parity, param_counts, train_flops_per_token
from cart_sweeps.model.cart import loop_index_table
from cart_sweeps.model.layers import Block
from cart_sweeps.modelspec import ffn_width


def model_config(**settings: object) -> ModelConfig:
    """A model config as a model's file states it (conf/model/*.yaml: its name, head dim, context), then `settings`."""
    return ModelConfig(**{"name": "cart", "head_dim": 64, "max_seq_len": 1024, **settings})  # type: ignore[arg-type]


TINY = model_config(d_model=32, head_dim=8, n_prelude=2, n_loops=3, vocab_size=61, max_seq_len=16)
SWITCHES = [
    {},
    {"core_update": "paper"},
    {"unfreeze_kv": True},
    {"n_loops": 1},
    {"unshare_core": True},
    {"unshare_core": True, "self_attn_core": True},
    {"disable_hyper": True},
    {"disable_lti": True},
    {"disable_lie": True},
    {"core_update": "paper", "disable_lti": True, "disable_hyper": True, "unfreeze_kv": True},
]


def test_every_boolean_model_field_is_an_ablation_switch_and_tested() -> None:
    """A new switch without `metadata=ABLATION` would label its runs `base` (the baseline) in every table."""
    booleans = {f.name for f in fields(ModelConfig) if f.type in (bool, "bool")}
    assert booleans == set(ABLATION_SWITCHES)
    assert set(ABLATION_SWITCHES) <= {k for switch in SWITCHES for k in switch}


def label(cfg: ModelConfig) -> str:
    flags = [k for k in ABLATION_SWITCHES if getattr(cfg, k)]
    flags += [cfg.core_update] if cfg.core_update == "paper" else []
    return f"{cfg.name}-d{cfg.d_model}-P{cfg.n_prelude}-R{cfg.n_loops}-" + ",".join(flags)


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(
    ("d", "loops", "stored", "effective"),
    [
        (256, 6, 14.37, 17.97),
        (256, 8, 14.37, 19.42),
        (256, 10, 14.37, 20.86),
        (1024, 6, 125.09, 178.84),
        (1024, 8, 125.09, 200.34),
        (1024, 10, 125.09, 221.84),
    ],
)
def test_reference_check_values_cart(d: int, loops: int, stored: float, effective: float) -> None:
    counts = param_counts(model_config(d_model=d, n_prelude=6, n_loops=loops, vocab_size=32000))
    assert round(counts["stored"] / 1e6, 2) == stored
    assert round(counts["effective"] / 1e6, 2) == effective
    assert counts["non_embedding_effective"] == counts["effective"] - 32000 * d


@pytest.mark.parametrize(("layers", "stored"), [(7, 122.70), (12, 186.93)])
def test_reference_check_values_dense(layers: int, stored: float) -> None:
    counts = param_counts(model_config(name="dense", d_model=1024, n_layers=layers, vocab_size=32000))
    assert round(counts["stored"] / 1e6, 2) == stored
    assert counts["effective"] == counts["stored"]


def test_ffn_width_is_the_authors_rounding() -> None:
    assert [ffn_width(d) for d in (256, 512, 768, 1024)] == [768, 1536, 2048, 2816]
    assert [ffn_width(d) for d in (32, 64, 96)] == [256, 256, 256]


def test_dense_parity_reproduces_the_papers_pair() -> None:
    cart = model_config(d_model=1024, n_prelude=6, n_loops=6, vocab_size=32000)
    assert dense_parity(cart, "stored") == 7
    assert dense_parity(cart, "effective") == 12


@pytest.mark.parametrize(
    "cfg",
    [
        replace(TINY, d_model=32, head_dim=8, n_prelude=0, n_loops=1),
        replace(TINY, d_model=64, head_dim=16, n_prelude=2, n_loops=4),
        replace(TINY, d_model=96, head_dim=32, n_prelude=3, n_loops=16),
        model_config(d_model=256, n_prelude=1, n_loops=2, vocab_size=32000),
        replace(TINY, name="dense", n_layers=3),
    ]
    + [replace(TINY, **switch) for switch in SWITCHES],
    ids=lambda c: label(c),
)
def test_stored_count_equals_built_numel(cfg: ModelConfig) -> None:
    model = build_model(cfg)
    counts = param_counts(cfg)
    assert counts["stored"] == numel(model)
    if cfg.name == "cart":
        assert counts["core"] == numel(model.cores)
        shared = 0 if cfg.unshare_core else numel(model.cores)
        anchor = numel(model.anchor) if cfg.unfreeze_kv else 0
        assert counts["effective"] == counts["stored"] + (cfg.n_loops - 1) * (shared + anchor)


def test_train_flops_per_token_formula() -> None:
    dense = model_config(name="dense", d_model=1024, n_layers=12, vocab_size=32000)
    assert train_flops_per_token(dense, 1024) == 6 * param_counts(dense)["stored"] + 12 * 12 * 1024 * 1024
    cart = model_config(d_model=1024, n_prelude=6, n_loops=6, vocab_size=32000)
    attn = 12 * (6 + 6 + 1) * 1024 * 512
    assert train_flops_per_token(cart, 512) == 6 * param_counts(cart)["effective"] + attn


def _causal(cfg: ModelConfig) -> None:
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        base = model(tokens)
        for pos in (1, 7):
            changed = tokens.clone()
            changed[:, pos] = (changed[:, pos] + 1) % cfg.vocab_size
            out = model(changed)
            torch.testing.assert_close(out[:, :pos], base[:, :pos], rtol=0, atol=1e-5)
            assert not torch.allclose(out[:, pos], base[:, pos])


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: label(replace(TINY, **s)))
def test_cart_is_causal(switch: dict) -> None:
    _causal(replace(TINY, **switch))


def test_dense_is_causal() -> None:
    _causal(replace(TINY, name="dense", n_layers=2))


def test_initial_blend_gate_and_no_decay_names() -> None:
    model = build_model(TINY)
    assert torch.softmax(model.hc_logits.detach(), dim=0).tolist() == pytest.approx([0.576, 0.212, 0.212], abs=5e-4)
    assert model.rho() == pytest.approx(0.9)
    assert build_model(replace(TINY, disable_lti=True)).rho() == 1.0
    assert build_model(replace(TINY, name="dense", n_layers=1)).rho() is None
    names = model.no_decay_names()
    assert {"gate", "hc_logits", "lie_proj.weight", "norm.weight", "cores.0.attn_norm.weight"} <= names
    assert not any("embed" in n or n.endswith((".q.weight", "up.weight")) for n in names)


def test_init_std_and_loop_index_table() -> None:
    torch.manual_seed(0)
    model = build_model(replace(TINY, d_model=64, head_dim=16, vocab_size=4096))
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert torch.all(model.norm.weight == 1)
    pe = loop_index_table()
    assert pe.shape == (16, 32)
    assert pe[3, 0].item() == pytest.approx(math.sin(3))
    assert pe[3, 1].item() == pytest.approx(math.cos(3))
    assert pe[5, 2].item() == pytest.approx(math.sin(5 * math.exp(-2 * math.log(10000) / 32)))


def test_block_paper_update_returns_only_the_delta() -> None:
    torch.manual_seed(0)
    block = Block("cross", 32, 8, 1e-6)
    x, k, v = torch.randn(2, 5, 32), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    torch.testing.assert_close(block(x, k, v) - block(x, k, v, residual=False), x)


def test_unfreeze_kv_changes_the_computation_with_the_same_weights() -> None:
    torch.manual_seed(0)
    frozen = build_model(TINY)
    unfrozen = build_model(replace(TINY, unfreeze_kv=True))
    unfrozen.load_state_dict(frozen.state_dict())
    tokens = torch.randint(0, TINY.vocab_size, (1, 8))
    with torch.no_grad():
        assert not torch.allclose(frozen(tokens), unfrozen(tokens))


def test_variable_loops_at_inference() -> None:
    torch.manual_seed(0)
    model = build_model(replace(TINY, n_loops=6)).eval()
    tokens = torch.randint(0, TINY.vocab_size, (2, 8))
    with torch.no_grad():
        trained = model(tokens)
        for loops in (2, 16):
            out = model(tokens, n_loops=loops)
            assert out.shape == (2, 8, TINY.vocab_size) and torch.isfinite(out).all()
            assert not torch.allclose(out, trained)
        with pytest.raises(ValueError, match="1..16"):
            model(tokens, n_loops=17)
        assert build_model(replace(TINY, disable_lie=True))(tokens, n_loops=20).shape == trained.shape
        with pytest.raises(ValueError, match="unshared cores"):
            build_model(replace(TINY, unshare_core=True))(tokens, n_loops=4)


def test_bf16_autocast_forward() -> None:
    model = build_model(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    assert torch.isfinite(logits.float()).all()


def test_compiles_without_graph_breaks() -> None:
    torch.manual_seed(0)
    model = build_model(replace(TINY, n_loops=2, unfreeze_kv=True)).eval()
    tokens = torch.randint(0, TINY.vocab_size, (1, 8))
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens), model(tokens))


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"d_model": 100, "head_dim": 64}, "model.d_model"),
        ({"d_model": 18, "head_dim": 6}, "model.d_model"),
        ({"n_loops": 0}, "model.n_loops"),
        ({"n_loops": 17}, "model.n_loops"),
        ({"n_prelude": -1}, "model.n_prelude"),
        ({"name": "dense", "n_layers": 0}, "model.n_layers"),
        ({"self_attn_core": True}, "model.self_attn_core"),
        ({"gate_init": 1.0}, "model.gate_init"),
    ],
)
def test_validation_errors_name_the_key(changes: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_model(replace(TINY, **changes))


def test_builds_from_the_composed_config(compose) -> None:
    cfg = compose(["model=dense", "model.d_model=64", "model.n_layers=2", "model.max_seq_len=32"])
    model = build_model(cfg.model)
    assert numel(model) == param_counts(cfg.model)["stored"]
    assert model(torch.randint(0, 32000, (1, 4))).shape == (1, 4, 32000)
    with pytest.raises(ConfigError, match=r"model\.n_layers"):
        build_model(compose(["model=dense", "model.n_layers=0"]).model)
