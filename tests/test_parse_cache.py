"""The parse cache (cart_sweeps/parse_cache.py) wraps a private omegaconf function: the pin (<2.4) is checked here."""

from __future__ import annotations

import omegaconf.base
from omegaconf import OmegaConf

from cart_sweeps.parse_cache import install


def test_resolving_goes_through_the_cache_and_gives_the_same_values() -> None:
    cfg = OmegaConf.create({"a": 3, "b": "${a}", "c": "x${a}y"})
    plain = OmegaConf.to_container(cfg, resolve=True)
    install()
    install()  # twice in a process wraps once
    cached = omegaconf.base.parse
    assert not hasattr(cached.__wrapped__, "cache_info")
    before = cached.cache_info().hits
    assert OmegaConf.to_container(OmegaConf.create({"a": 3, "b": "${a}", "c": "x${a}y"}), resolve=True) == plain
    assert OmegaConf.to_container(cfg, resolve=True) == plain
    assert cached.cache_info().hits > before  # omegaconf resolves through omegaconf.base.parse: the patch holds
