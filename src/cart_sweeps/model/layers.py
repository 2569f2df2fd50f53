"""Building blocks shared by CART and the dense baseline (REFERENCE.md section 1): every attention is
`F.scaled_dot_product_attention(is_causal=True)` on [B, H, T, hd], so a block compiles to one graph. No biases."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cart_sweeps.modelspec import ffn_width

Rope = tuple[Tensor, Tensor]  # (cos, sin), each [T, head_dim], fp32


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 whatever the autocast dtype, cast back to the input's dtype."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * self.weight.float()).type_as(x)


class RotaryTable(nn.Module):
    """cos/sin tables for rotate-half RoPE, one per model, sliced to the sequence length."""

    cos: Tensor  # buffers
    sin: Tensor

    def __init__(self, head_dim: int, max_seq_len: int, base: float) -> None:
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, seq_len: int) -> Rope:
        if seq_len > self.cos.shape[0]:
            raise ValueError(f"sequence length {seq_len} exceeds model.max_seq_len={self.cos.shape[0]}")
        return self.cos[:seq_len], self.sin[:seq_len]


def apply_rope(x: Tensor, rope: Rope) -> Tensor:
    """Rotate-half RoPE on [B, H, T, hd], in fp32 so that bf16 activations keep their positions."""
    cos, sin = rope
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rotated * sin).type_as(x)


def split_heads(x: Tensor, head_dim: int) -> Tensor:
    """[B, T, d] -> [B, H, T, hd]."""
    b, t, _ = x.shape
    return x.view(b, t, -1, head_dim).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """[B, H, T, hd] -> [B, T, d]."""
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, d: int) -> None:
        super().__init__()
        hidden = ffn_width(d)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LatentKV(nn.Module):
    """K and V from one shared latent c = kv_down(x) (d -> d/4): MLA's projection, and CART's anchor."""

    def __init__(self, d: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.kv_down = nn.Linear(d, d // 4, bias=False)
        self.k_up = nn.Linear(d // 4, d, bias=False)
        self.v_up = nn.Linear(d // 4, d, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        c = self.kv_down(x)
        return split_heads(self.k_up(c), self.head_dim), split_heads(self.v_up(c), self.head_dim)


class MLASelfAttention(nn.Module):
    """Simplified MLA: full-rank Q, latent K/V, RoPE on Q and K after up-projection (2.75 d^2)."""

    def __init__(self, d: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(d, d, bias=False)
        self.kv = LatentKV(d, head_dim)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor, rope: Rope) -> Tensor:
        q = apply_rope(split_heads(self.q(x), self.head_dim), rope)
        k, v = self.kv(x)
        y = F.scaled_dot_product_attention(q, apply_rope(k, rope), v, is_causal=True)
        return self.o(merge_heads(y))


class MHASelfAttention(nn.Module):
    """Full-rank multi-head attention (separate q, k, v, o, each d x d) with RoPE: the dense layer."""

    def __init__(self, d: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor, rope: Rope) -> Tensor:
        q = apply_rope(split_heads(self.q(x), self.head_dim), rope)
        k = apply_rope(split_heads(self.k(x), self.head_dim), rope)
        y = F.scaled_dot_product_attention(q, k, split_heads(self.v(x), self.head_dim), is_causal=True)
        return self.o(merge_heads(y))


class CausalCrossAttention(nn.Module):
    """CART's core attention: Q and O only (2 d^2), K/V from the anchor, no RoPE; causal (unlike the author's first)."""

    def __init__(self, d: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q = split_heads(self.q(x), self.head_dim)
        return self.o(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True)))


ATTENTION = {"mla": MLASelfAttention, "mha": MHASelfAttention, "cross": CausalCrossAttention}


class Block(nn.Module):
    """Pre-norm block `x + attn(norm(x), *ctx)`, then `+ SwiGLU(norm(.))`; `ctx`: (rope,) or (K, V).
    `residual=False` returns only the two contributions attn + ffn (CART's core under core_update=paper)."""

    def __init__(self, attention: str, d: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(d, eps)
        self.attn = ATTENTION[attention](d, head_dim)
        self.ffn_norm = RMSNorm(d, eps)
        self.ffn = SwiGLU(d)

    def forward(self, x: Tensor, *ctx: Tensor | Rope, residual: bool = True) -> Tensor:
        a = self.attn(self.attn_norm(x), *ctx)
        h = x + a
        f = self.ffn(self.ffn_norm(h))
        return h + f if residual else a + f


def init_weights(module: nn.Module, std: float) -> None:
    """Every Linear and Embedding N(0, std), no depth scaling; norms keep their weight of 1."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)
