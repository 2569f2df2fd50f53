"""OmegaConf's interpolation parser, its trees kept by text: installed by `register_configs` before composing.

OmegaConf parses an interpolation's text (with ANTLR, 0.1-0.2 ms) each time it resolves it, and naming,
validating and costing a stage's runs resolve the same few texts thousands of times (model.vocab_size,
paths.runs). A parse tree depends on its text alone and resolving only reads it: trees are kept by text.
`omegaconf.base.parse` is private, which is why pyproject pins omegaconf <2.4 (checked on 2.3);
tests/test_parse_cache.py shows resolving goes through the cache on the installed release.
"""

from __future__ import annotations

import functools

import omegaconf.base


def install() -> None:
    """Wrap `omegaconf.base.parse` in a cache, once per process."""
    if not hasattr(omegaconf.base.parse, "cache_info"):
        omegaconf.base.parse = functools.lru_cache(maxsize=1024)(omegaconf.base.parse)
