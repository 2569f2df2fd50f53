"""The models: CART and the dense baseline, plus their parameter counts and FLOPs by formula.

`model_cfg` may be a DictConfig or a `config.ModelConfig`: only attribute access is used.
"""

from __future__ import annotations

from typing import Any

from cart_sweeps.config import validate_model
from cart_sweeps.model.cart import CART
from cart_sweeps.model.dense import Dense
from cart_sweeps.model.params import dense_parity, param_counts, train_flops_per_token

__all__ = ["CART", "Dense", "build_model", "dense_parity", "param_counts", "train_flops_per_token"]


def build_model(model_cfg: Any) -> CART | Dense:
    """Validate the config (one clear ConfigError per problem), then build CART or Dense on the CPU."""
    validate_model(model_cfg)
    return Dense(model_cfg) if model_cfg.name == "dense" else CART(model_cfg)
