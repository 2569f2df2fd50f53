"""The data a stage's runs read, prepared by its driver before the first run launches: the runs would otherwise wait
in silence on the first of them preparing it (about a minute for the embedded corpus on 2 cores), and the stage's
ETA would take that minute for a run's pace. Hub data is refused unprepared before this (sweep/preflight.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from omegaconf import DictConfig

from cart_sweeps.data.recipe import as_config, recipe_dir, recipe_hash
from cart_sweeps.text import clock


def prepare_for(stage: str, recipes: Iterable[DictConfig]) -> None:
    """Prepare each of `recipes` not prepared yet, saying what and where (the preparer's bars on a terminal)."""
    todo: dict[str, DictConfig] = {}
    for data in recipes:
        cfg = as_config(data)
        if not recipe_dir(cfg, digest := recipe_hash(cfg)).exists():
            todo.setdefault(digest, cfg)
    for digest, cfg in todo.items():
        from cart_sweeps.data.prepare import prepare  # imports `datasets` (~1.5 s): only when there is work

        sets = ", ".join(v.name for v in cfg.validation)
        print(
            f"stage {stage}: preparing data={cfg.name} for its runs, once (a tokenizer, train.bin, validation sets "
            f"{sets}) in {recipe_dir(cfg, digest)}",
            flush=True,
        )
        started = time.monotonic()
        prepare(cfg)
        print(f"stage {stage}: data={cfg.name} prepared in {clock(time.monotonic() - started)}", flush=True)
