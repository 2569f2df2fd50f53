"""OmegaConf's interpolation parser, its trees kept by text.

OmegaConf parses an interpolation's text (with ANTLR, 0.1-0.2 ms) each time it resolves it, and naming, validating
and costing a stage's runs resolve the same few texts thousands of times (model.vocab_size, paths.runs). A parse
tree depends on its text alone and resolving only reads it: trees are kept by text.
"""

from __future__ import annotations

import functools

import omegaconf.base


def cache_interpolation_parses() -> None:
    """Wrap `omegaconf.base.parse` (private: OmegaConf resolves every interpolation through it and offers no hook or
    cache of its own) in an LRU cache, once per process. Checked on omegaconf 2.3.0 and 2.3.1."""
    if not hasattr(omegaconf.base.parse, "cache_info"):
        omegaconf.base.parse = functools.lru_cache(maxsize=1024)(omegaconf.base.parse)
