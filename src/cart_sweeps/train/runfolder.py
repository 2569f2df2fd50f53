"""The run folder's summary.json: how a run ended, what it was, and its final metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import config_id, run_id, run_label, variant
from cart_sweeps.model import param_counts

SUMMARY = "summary.json"


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / SUMMARY
    return json.loads(path.read_text()) if path.exists() else None


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Atomic, so a reader (the sweeper, the analysis) never sees half a file."""
    tmp = run_dir / f".{SUMMARY}.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(run_dir / SUMMARY)


def base_summary(cfg: DictConfig) -> dict[str, Any]:
    """The identity fields every summary.json carries (what the analysis groups by)."""
    counts = param_counts(cfg.model)
    return {
        "run_id": run_id(cfg),
        "config_id": config_id(cfg),  # shared by runs that differ only in seed: what the analysis averages over
        "label": run_label(cfg),
        "stage": cfg.stage.name,
        "variant": variant(cfg.model),
        "seed": cfg.seed,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "trainer": OmegaConf.to_container(cfg.trainer, resolve=True),
        "data": cfg.data.name,
        "params_stored": counts["stored"],
        "params_effective": counts["effective"],
    }
