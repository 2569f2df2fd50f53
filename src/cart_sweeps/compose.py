"""Compose the config outside `@hydra.main` (runs launched by the sweeper, plan, bench, tests)."""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from cart_sweeps.config import CONF_DIR, register_configs


def compose_config(overrides: Sequence[str] = (), hydra_config: bool = False) -> DictConfig:
    """The config `python -m cart_sweeps <overrides>` would run, composed from the real conf/ tree."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_config)
