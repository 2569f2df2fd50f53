"""CART: prelude -> anchor K/V -> one shared core looped R times -> coda (REFERENCE.md section 1); the default is
the author's code, the paper's other readings and the ablations are ModelConfig switches."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from cart_sweeps.config import MAX_LOOPS
from cart_sweeps.model.layers import Block, LatentKV, RMSNorm, RotaryTable, init_weights
from cart_sweeps.modelspec import HC_TAPS, LIE_DIM


def loop_index_table(rows: int = MAX_LOOPS, dim: int = LIE_DIM) -> Tensor:
    """The author's sinusoidal loop-index table: pe[r, 0::2] = sin(r div), pe[r, 1::2] = cos(r div)."""
    r = torch.arange(rows, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(rows, dim)
    pe[:, 0::2] = torch.sin(r * div)
    pe[:, 1::2] = torch.cos(r * div)
    return pe


class CART(nn.Module):
    """Context-Anchored Recurrent Transformer. `forward(tokens, n_loops)` -> logits [B, T, V]."""

    lie_table: Tensor  # a buffer, registered with the Lie projection

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        d, hd, eps = cfg.d_model, cfg.head_dim, cfg.norm_eps
        self.n_loops = cfg.n_loops
        self.reference_update = cfg.core_update == "reference"
        self.unfreeze_kv = cfg.unfreeze_kv
        self.self_attn_core = cfg.self_attn_core
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.rope = RotaryTable(hd, cfg.max_seq_len, cfg.rope_base)
        self.prelude = nn.ModuleList(Block("mla", d, hd, eps) for _ in range(cfg.n_prelude))
        # A self-attention core reads no K/V, so that ablation builds no anchor.
        self.anchor = None if cfg.self_attn_core else LatentKV(d, hd)
        n_cores = cfg.n_loops if cfg.unshare_core else 1
        core_kind = "mla" if cfg.self_attn_core else "cross"
        self.cores = nn.ModuleList(Block(core_kind, d, hd, eps) for _ in range(n_cores))
        self.hc_logits = None if cfg.disable_hyper else nn.Parameter(torch.tensor([1.0, 0.0, 0.0]))
        gate = math.log(cfg.gate_init / (1 - cfg.gate_init))
        self.gate = None if cfg.disable_lti else nn.Parameter(torch.full((d,), gate))
        self.lie_proj = None if cfg.disable_lie else nn.Linear(LIE_DIM, d, bias=False)
        if self.lie_proj is not None:
            self.register_buffer("lie_table", loop_index_table(), persistent=False)
        self.coda = Block("mla", d, hd, eps)
        self.norm = RMSNorm(d, eps)
        init_weights(self, cfg.init_std)

    def _check_loops(self, n_loops: int) -> None:
        if len(self.cores) > 1 and n_loops != len(self.cores):
            raise ValueError(f"this model has {len(self.cores)} unshared cores, so it runs only R={len(self.cores)}")
        if n_loops < 1 or (self.lie_proj is not None and n_loops > MAX_LOOPS):
            raise ValueError(f"n_loops={n_loops} must be in 1..{MAX_LOOPS} (the loop-index table's rows)")

    def _blend(self, buffer: list[Tensor]) -> Tensor:
        if self.hc_logits is None:
            return buffer[0]
        w = torch.softmax(self.hc_logits, dim=0)
        return w[0] * buffer[0] + w[1] * buffer[1] + w[2] * buffer[2]

    def forward(self, tokens: Tensor, n_loops: int | None = None) -> Tensor:
        """Logits [B, T, V]; `n_loops` overrides the trained R (variable-R inference, up to 16)."""
        loops = self.n_loops if n_loops is None else n_loops
        self._check_loops(loops)
        rope = self.rope(tokens.shape[1])
        e = self.embed(tokens)
        for block in self.prelude:
            e = block(e, rope)
        kv = None if self.anchor is None or self.unfreeze_kv else self.anchor(e)
        buffer = [e] * HC_TAPS
        for r in range(loops):
            h_in = self._blend(buffer)
            if self.lie_proj is not None:
                h_in = h_in + self.lie_proj(self.lie_table[r])
            ctx = (rope,) if self.anchor is None else kv or self.anchor(h_in)  # no anchor: self-attention core
            out = self.cores[r if len(self.cores) > 1 else 0](h_in, *ctx, residual=self.reference_update)
            h = h_in + out if self.gate is None else torch.sigmoid(self.gate) * h_in + out
            buffer = [h, *buffer[:-1]]
        h = self.norm(self.coda(h, rope))
        return h @ self.embed.weight.T

    def rho(self) -> float:
        """max_i sigmoid(a_i), the paper's spectral radius; 1.0 without the gate (h = h_in + out)."""
        if self.gate is None:
            return 1.0
        return torch.sigmoid(self.gate.detach().float()).max().item()

    def no_decay_names(self) -> set[str]:
        """Norm weights, the gate a, the HC logits and the LIE projection: spared when decay_all=false."""
        return {
            n
            for n, _ in self.named_parameters()
            if n.endswith("norm.weight") or n in {"gate", "hc_logits", "lie_proj.weight"}
        }
