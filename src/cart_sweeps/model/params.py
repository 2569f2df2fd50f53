"""Parameter counts and training FLOPs by formula (REFERENCE.md's, each model's in cart_sweeps.modelspec),
without building any weights: the driver and `plan` cost runs with it, torch-free."""

from __future__ import annotations

import math
from typing import Any

from cart_sweeps.modelspec import dense_stored, layer_sizes, spec_of


def param_counts(cfg: Any) -> dict[str, int]:
    """stored, effective, core (stored core parameters), embedding (tied: counted once) and non_embedding_effective."""
    counts = spec_of(cfg).counts(cfg)
    embedding = cfg.vocab_size * cfg.d_model
    return {**counts, "embedding": embedding, "non_embedding_effective": counts["effective"] - embedding}


def train_flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), Chinchilla/PaLM style: 6 x every non-embedding effective
    parameter (norms, gate and LIE too: < 0.1%), 6 V d for the tied output projection, and 12 n_attn d seq_len
    for attention (full, non-causal), one attention per block the spec counts (CART: P + R + 1)."""
    counts = param_counts(cfg)
    d = cfg.d_model
    n_attn = spec_of(cfg).blocks(cfg)
    return float(6 * counts["non_embedding_effective"] + 6 * cfg.vocab_size * d + 12 * n_attn * d * seq_len)


def dense_parity(cfg: Any, kind: str = "stored") -> int:
    """The dense depth (same d, vocab, head dim) at parameter parity with a CART config, reproducing the paper's
    pair (7 and 12 at d=1024 P=6 R=6): at stored parity the deepest dense model no larger than CART's stored
    count, at effective parity the shallowest no smaller than its effective count, so the two bracket CART."""
    if kind not in ("stored", "effective"):
        raise ValueError(f"kind={kind!r}: use 'stored' or 'effective'")
    depth = (param_counts(cfg)[kind] - dense_stored(cfg, 0)) / layer_sizes(cfg)["mha_block"]
    return max(1, math.floor(depth) if kind == "stored" else math.ceil(depth))
