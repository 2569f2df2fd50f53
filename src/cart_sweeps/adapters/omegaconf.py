"""OmegaConf's interpolation parser, its trees kept by text: OmegaConf parses an interpolation (0.1-0.2 ms) each
time it resolves it, and a stage's runs resolve the same few texts thousands of times."""

from __future__ import annotations

import functools

import omegaconf.base


def cache_interpolation_parses() -> None:
    """Wrap `omegaconf.base.parse` (private: OmegaConf resolves every interpolation through it and offers no hook or
    cache of its own) in an LRU cache, once per process. Checked on omegaconf 2.3.0 and 2.3.1."""
    if not hasattr(omegaconf.base.parse, "cache_info"):
        omegaconf.base.parse = functools.lru_cache(maxsize=1024)(omegaconf.base.parse)
