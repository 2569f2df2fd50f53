"""Each model's spec, registered once in SPECS: all the code outside the model's own module knows of it, so a
new model is its spec here, its module in model/ and its conf/model/<name>.yaml. Torch-free; `m` is a model
config (a DictConfig or a `config.ModelConfig`: attribute access only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cart_sweeps.config import MAX_LOOPS, ConfigError

LIE_DIM = 32  # width of the loop-index embedding table's rows
HC_TAPS = 3  # hyper-connection taps: the core's input blends the last 3 states


def ffn_width(d: int) -> int:
    """The author's SwiGLU hidden width: 8/3 d rounded up to a multiple of 256 (768 at d=256)."""
    return math.ceil(int(8 / 3 * d) / 256) * 256


def layer_sizes(m: Any) -> dict[str, int]:
    """Parameters of one layer of each kind at width d (norms included, 2 per block)."""
    d = m.d_model
    latent_kv = 3 * d * (d // 4)  # kv_down, k_up, v_up: 0.75 d^2
    block = 3 * d * ffn_width(d) + 2 * d  # SwiGLU + the two RMSNorms
    return {
        "mla_block": 2 * d * d + latent_kv + block,  # prelude, coda, self-attention core
        "cross_block": 2 * d * d + block,  # core: Q and O only
        "mha_block": 4 * d * d + block,  # dense layer
        "anchor": latent_kv,
    }


def dense_stored(m: Any, n_layers: int) -> int:
    """A dense model's stored parameters at depth `n_layers` (tied embedding, final norm)."""
    return m.vocab_size * m.d_model + n_layers * layer_sizes(m)["mha_block"] + m.d_model


Counts = dict[str, int]  # stored, effective, core (the stored core parameters)


def _cart_counts(m: Any) -> Counts:
    """effective = stored + (R-1) * core for a shared core (the loop unrolled), plus (R-1) * anchor with
    unfreeze_kv (the anchor then runs every loop); an unshared core is already stored R times."""
    d, s, loops = m.d_model, layer_sizes(m), m.n_loops
    anchor = 0 if m.self_attn_core else s["anchor"]
    one_core = s["mla_block"] if m.self_attn_core else s["cross_block"]
    core = one_core * (loops if m.unshare_core else 1)
    extras = (0 if m.disable_hyper else HC_TAPS) + (0 if m.disable_lti else d) + (0 if m.disable_lie else LIE_DIM * d)
    stored = m.vocab_size * d + (m.n_prelude + 1) * s["mla_block"] + anchor + core + d + extras
    effective = stored + (loops - 1) * ((0 if m.unshare_core else one_core) + (anchor if m.unfreeze_kv else 0))
    return {"stored": stored, "effective": effective, "core": core}


def _dense_counts(m: Any) -> Counts:
    stored = dense_stored(m, m.n_layers)
    return {"stored": stored, "effective": stored, "core": 0}


def check_cart_loops(m: Any, loops: int, key: str) -> None:
    """A CART model run at `loops` loops (trained, or evaluated at another R) as the model allows it."""
    if loops < 1 or (loops > MAX_LOOPS and not m.disable_lie):
        raise ConfigError(f"{key}={loops} must be in 1..{MAX_LOOPS} (the loop-index table's rows)")
    if m.unshare_core and loops != m.n_loops:
        raise ConfigError(f"{key}={loops} must be model.n_loops={m.n_loops}: an unshared core has one block per loop")


def _check_cart(m: Any) -> None:
    if m.d_model % 4:
        raise ConfigError(f"model.d_model={m.d_model} must be a multiple of 4 (the K/V latent is d/4 wide)")
    if not 0 < m.gate_init < 1:
        raise ConfigError(f"model.gate_init={m.gate_init} must be in (0, 1): it is sigmoid(a) at init")
    check_cart_loops(m, m.n_loops, "model.n_loops")
    if m.self_attn_core and not m.unshare_core:
        raise ConfigError("model.self_attn_core=true needs model.unshare_core=true (the paper's ablation)")
    if m.self_attn_core and m.unfreeze_kv:
        raise ConfigError("model.unfreeze_kv=true does nothing with model.self_attn_core=true (no anchor)")


@dataclass(frozen=True)
class ModelSpec:
    cls: str  # the class model.name builds, by dotted path (cart_sweeps.entry: imported on first use)
    shape: tuple[tuple[str, str], ...]  # the label's letter for each shape key that applies: (("L", "n_layers"),)
    blocks: Callable[[Any], int]  # blocks a forward pass applies, each attending over the sequence once
    counts: Callable[[Any], Counts]  # parameter counts by formula (tests check stored against the built model)
    kind: str = ""  # the label's first part, before d<width>: "dense" (CART's labels start at the width)
    ablations: bool = False  # whether the ablation switches and core_update apply (a label names them)
    check: Callable[[Any], None] = lambda m: None  # the model's own value checks, one ConfigError each
    # An evaluation at another loop count (stage.eval_n_loops): the model's rule, or None where it has no loops.
    check_loops: Callable[[Any, int, str], None] | None = None

    @property
    def shape_keys(self) -> tuple[str, ...]:
        return tuple(key for _, key in self.shape)

    def parts(self, m: Any) -> list[str]:
        """The label's model part without the ablation variant, piece by piece: [d256, P6, R8], [dense, d1024, L7]."""
        shape = [f"{letter}{getattr(m, key)}" for letter, key in self.shape]
        return [*([self.kind] if self.kind else []), f"d{m.d_model}", *shape]


SPECS: dict[str, ModelSpec] = {
    "cart": ModelSpec(
        cls="cart_sweeps.model.cart.CART",
        shape=(("P", "n_prelude"), ("R", "n_loops")),
        blocks=lambda m: m.n_prelude + m.n_loops + 1,  # prelude, each loop's core, coda
        counts=_cart_counts,
        ablations=True,
        check=_check_cart,
        check_loops=check_cart_loops,
    ),
    "dense": ModelSpec(
        cls="cart_sweeps.model.dense.Dense",
        shape=(("L", "n_layers"),),
        blocks=lambda m: m.n_layers,
        counts=_dense_counts,
        kind="dense",
    ),
}

# Every shape key of any model, in registration order: plan's columns (None where a model lacks one).
SHAPE_KEYS = tuple(dict.fromkeys(key for spec in SPECS.values() for key in spec.shape_keys))


def spec_of(m: Any) -> ModelSpec:
    """The spec of a model config (or of a model name); an unknown name is one line naming the known ones."""
    name = m if isinstance(m, str) else m.name
    if (spec := SPECS.get(str(name))) is None:
        known = ", ".join(SPECS)
        raise ConfigError(
            f"model.name={name}: no such model (known: {known}); a model is registered in cart_sweeps/modelspec.py"
        )
    return spec
