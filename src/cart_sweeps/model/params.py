"""Parameter counts and training FLOPs by formula, without building any weights, and the shape facts
the models are built from.

The formulas are REFERENCE.md's "Parameter counts"; tests check `stored` against the built model's
numel for every switch, so the two cannot drift apart. Torch-free: the driver and `plan` cost runs with it.
"""

from __future__ import annotations

import math
from typing import Any

LIE_DIM = 32  # width of the loop-index embedding table's rows
HC_TAPS = 3  # hyper-connection taps: the core's input blends the last 3 states


def ffn_width(d: int) -> int:
    """The author's SwiGLU hidden width: 8/3 d rounded up to a multiple of 256 (768 at d=256)."""
    return math.ceil(int(8 / 3 * d) / 256) * 256


def _sizes(cfg: Any) -> dict[str, int]:
    """Parameters of one layer of each kind at width d (norms included, 2 per block)."""
    d = cfg.d_model
    latent_kv = 3 * d * (d // 4)  # kv_down, k_up, v_up: 0.75 d^2
    block = 3 * d * ffn_width(d) + 2 * d  # SwiGLU + the two RMSNorms
    return {
        "mla_block": 2 * d * d + latent_kv + block,  # prelude, coda, self-attention core
        "cross_block": 2 * d * d + block,  # core: Q and O only
        "mha_block": 4 * d * d + block,  # dense layer
        "anchor": latent_kv,
    }


def _dense_stored(cfg: Any, n_layers: int) -> int:
    return cfg.vocab_size * cfg.d_model + n_layers * _sizes(cfg)["mha_block"] + cfg.d_model


def param_counts(cfg: Any) -> dict[str, int]:
    """stored, effective, core, embedding and non_embedding_effective parameter counts.

    effective = stored + (R-1) * core for a shared core (the loop unrolled), plus (R-1) * anchor with
    unfreeze_kv (the anchor then runs every loop); an unshared core is already stored R times. `core` is
    the stored core parameters (all R blocks when unshared; 0 for dense). The embedding is tied, so it is
    counted once.
    """
    d, embedding = cfg.d_model, cfg.vocab_size * cfg.d_model
    if cfg.name == "dense":
        stored = _dense_stored(cfg, cfg.n_layers)
        return {
            "stored": stored,
            "effective": stored,
            "core": 0,
            "embedding": embedding,
            "non_embedding_effective": stored - embedding,
        }
    s, loops = _sizes(cfg), cfg.n_loops
    anchor = 0 if cfg.self_attn_core else s["anchor"]
    one_core = s["mla_block"] if cfg.self_attn_core else s["cross_block"]
    core = one_core * (loops if cfg.unshare_core else 1)
    extras = (
        (0 if cfg.disable_hyper else HC_TAPS) + (0 if cfg.disable_lti else d) + (0 if cfg.disable_lie else LIE_DIM * d)
    )
    stored = embedding + (cfg.n_prelude + 1) * s["mla_block"] + anchor + core + d + extras
    effective = stored + (loops - 1) * ((0 if cfg.unshare_core else one_core) + (anchor if cfg.unfreeze_kv else 0))
    return {
        "stored": stored,
        "effective": effective,
        "core": core,
        "embedding": embedding,
        "non_embedding_effective": effective - embedding,
    }


def train_flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), Chinchilla/PaLM style.

    Counted: 6 * every non-embedding effective parameter (one multiply-add per weight per token, x3 for
    the backward; norms, gate and LIE are counted too although they are not matmuls, < 0.1%);
    6 * V * d for the tied output projection (the embedding lookup itself is free); and
    12 * n_attn * d * seq_len for the score and value products of attention, where n_attn counts every
    attention evaluated (dense: L; CART: P + R + 1, each loop's core attending over the sequence).
    The attention term is the full, non-causal one, as Chinchilla and PaLM count it.
    """
    counts = param_counts(cfg)
    d = cfg.d_model
    n_attn = cfg.n_layers if cfg.name == "dense" else cfg.n_prelude + cfg.n_loops + 1
    return float(6 * counts["non_embedding_effective"] + 6 * cfg.vocab_size * d + 12 * n_attn * d * seq_len)


def dense_parity(cfg: Any, kind: str = "stored", rule: str = "bracket") -> int:
    """The dense depth (same d, vocab, head dim) at parameter parity with a CART config.

    rule="bracket" (default) reproduces the paper's pair (7 and 12 at d=1024 P=6 R=6): at stored parity
    the deepest dense model no larger than CART's stored count, at effective parity the shallowest dense
    model no smaller than CART's effective count, so the two baselines bracket CART. rule="nearest" takes
    the depth whose stored count is nearest (7 and 11 there: Dense-11 is 174.09M against 178.84M).
    """
    if kind not in ("stored", "effective"):
        raise ValueError(f"kind={kind!r}: use 'stored' or 'effective'")
    target = param_counts(cfg)[kind]
    base, layer = _dense_stored(cfg, 0), _sizes(cfg)["mha_block"]
    depth = (target - base) / layer
    if rule == "nearest":
        lower = max(1, math.floor(depth))
        return min((lower, lower + 1), key=lambda n: abs(_dense_stored(cfg, n) - target))
    if rule == "bracket":
        return max(1, math.floor(depth) if kind == "stored" else math.ceil(depth))
    raise ValueError(f"rule={rule!r}: use 'bracket' or 'nearest'")
