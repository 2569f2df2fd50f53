"""Parameter counts and training FLOPs by formula, without building any weights, from each model's spec.

The formulas are REFERENCE.md's "Parameter counts" (each model's in cart_sweeps.modelspec); tests check
`stored` against the built model's numel for every switch, so the two cannot drift apart. Torch-free: the
driver and `plan` cost runs with it.
"""

from __future__ import annotations

import math
from typing import Any

from cart_sweeps.modelspec import dense_stored, layer_sizes, spec_of


def param_counts(cfg: Any) -> dict[str, int]:
    """stored, effective, core, embedding and non_embedding_effective parameter counts.

    `core` is the stored core parameters (all R blocks when unshared; 0 for dense). The embedding is tied,
    so it is counted once.
    """
    counts = spec_of(cfg).counts(cfg)
    embedding = cfg.vocab_size * cfg.d_model
    return {**counts, "embedding": embedding, "non_embedding_effective": counts["effective"] - embedding}


def train_flops_per_token(cfg: Any, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), Chinchilla/PaLM style.

    Counted: 6 * every non-embedding effective parameter (one multiply-add per weight per token, x3 for
    the backward; norms, gate and LIE are counted too although they are not matmuls, < 0.1%);
    6 * V * d for the tied output projection (the embedding lookup itself is free); and
    12 * n_attn * d * seq_len for the score and value products of attention, where n_attn counts every
    attention evaluated, one per block the model's spec counts (dense: L; CART: P + R + 1, each loop's core
    attending over the sequence). The attention term is the full, non-causal one, as Chinchilla and PaLM count it.
    """
    counts = param_counts(cfg)
    d = cfg.d_model
    n_attn = spec_of(cfg).blocks(cfg)
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
    base, layer = dense_stored(cfg, 0), layer_sizes(cfg)["mha_block"]
    depth = (target - base) / layer
    if rule == "nearest":
        lower = max(1, math.floor(depth))
        return min((lower, lower + 1), key=lambda n: abs(dense_stored(cfg, n) - target))
    if rule == "bracket":
        return max(1, math.floor(depth) if kind == "stored" else math.ceil(depth))
    raise ValueError(f"rule={rule!r}: use 'bracket' or 'nearest'")
