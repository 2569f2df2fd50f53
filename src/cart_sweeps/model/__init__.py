"""The models by `model.name` (each one's spec: cart_sweeps.modelspec), built on first use, and their parameter
counts and FLOPs by formula; torch is imported only by `build_model`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from cart_sweeps.entry import load
from cart_sweeps.model.params import dense_parity, param_counts, train_flops_per_token
from cart_sweeps.modelspec import spec_of
from cart_sweeps.validate import validate_model

if TYPE_CHECKING:
    from cart_sweeps.model.cart import CART
    from cart_sweeps.model.dense import Dense

    LanguageModel = CART | Dense  # what build_model returns: the classes the specs name

__all__ = ["build_model", "dense_parity", "param_counts", "train_flops_per_token"]


def build_model(model_cfg: Any) -> LanguageModel:
    """Validate the config (one clear ConfigError per problem), then build the model on the CPU."""
    validate_model(model_cfg)
    return cast("LanguageModel", load(spec_of(model_cfg).cls, "model.name")(model_cfg))
