"""The dense baseline: L pre-norm layers of full-rank MHA with RoPE, SwiGLU, tied embedding."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from cart_sweeps.model.layers import Block, RMSNorm, RotaryTable, init_weights


class Dense(nn.Module):
    """Same interface as CART so the trainer treats both alike; `n_loops` is accepted and ignored."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        d, hd, eps = cfg.d_model, cfg.head_dim, cfg.norm_eps
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.rope = RotaryTable(hd, cfg.max_seq_len, cfg.rope_base)
        self.layers = nn.ModuleList(Block("mha", d, hd, eps) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(d, eps)
        init_weights(self, cfg.init_std)

    def forward(self, tokens: Tensor, n_loops: int | None = None) -> Tensor:
        rope = self.rope(tokens.shape[1])
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, rope)
        return self.norm(h) @ self.embed.weight.T

    def rho(self) -> None:
        """None: no gate."""
        return None

    def no_decay_names(self) -> set[str]:
        """The norm weights (of CART's no-decay kinds, the only ones a dense model has)."""
        return {n for n, _ in self.named_parameters() if n.endswith("norm.weight")}
