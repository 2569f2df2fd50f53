"""Atomic checkpoints: a torch file with the training state beside a JSON meta readable without torch; one
damaged anyway fails to load as a CheckpointError. Loading uses `weights_only=True`: a checkpoint is data, never code.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from cart_sweeps.config import ConfigError
from cart_sweeps.data.hashes import file_sha256
from cart_sweeps.model import build_model
from cart_sweeps.model.cart import CART
from cart_sweeps.model.dense import Dense
from cart_sweeps.record.runfolder import CKPT_DIR, atomic_write, checkpoint_path, read_meta

CORRUPT = ".corrupt"


class CheckpointError(Exception):
    """A checkpoint that does not load: truncated, garbage, or not this model's state."""


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: Path, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int, kept: bool = False
) -> Path:
    """Write checkpoint `step` atomically, meta last (it holds the sha256); `kept`: never pruned (a branch point)."""
    path = checkpoint_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest: list[str] = []

    def write(tmp: Path) -> None:
        torch.save(state, tmp)
        digest.append(file_sha256(tmp))  # an evaluation of this run names the checkpoint by it

    atomic_write(path, write)
    meta = {**meta, "step": step, "file": path.name, "sha256": digest[0], **({"kept": True} if kept else {})}
    atomic_write(path.with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(meta, indent=2)))
    prune(run_dir, keep)
    return path


def prune(run_dir: Path, keep: int) -> None:
    """Delete all but the `keep` newest checkpoints (0 keeps all), sparing those kept for branches."""
    if keep > 0:
        for old in [p for p in list_checkpoints(run_dir)[:-keep] if not _kept(p)]:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (a .pt with its .json meta), oldest first."""
    folder = run_dir / CKPT_DIR
    return sorted(p for p in folder.glob("step_*.pt") if p.with_suffix(".json").exists())


def _kept(path: Path) -> bool:
    """Whether the checkpoint was kept for branches (its meta says so; one that does not read is not)."""
    try:
        return bool(read_meta(path).get("kept"))
    except (OSError, ValueError):
        return False


def restore(path: Path, device: torch.device, apply: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Load checkpoint `path` and `apply` its state; returns the state, or raises CheckpointError."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
        apply(state)
    except (torch.OutOfMemoryError, MemoryError):  # too small a device, not a damaged file
        raise
    except Exception as err:
        raise CheckpointError(f"{path} does not load ({type(err).__name__})") from err
    return state


def set_aside(path: Path) -> Path:
    """Rename a checkpoint that does not load, and its meta, out of the resume's way (kept for a look)."""
    aside = path.with_name(path.name + CORRUPT)
    path.replace(aside)
    meta = path.with_suffix(".json")
    meta.replace(meta.with_name(meta.name + CORRUPT))
    return aside


def load_trained(
    run_dir: Path, model_cfg: DictConfig, device: torch.device, key: str, step: int | None = None
) -> tuple[CART | Dense, int]:
    """The model of `run_dir`'s checkpoint at `step` (None: its newest) on `device`, and its step."""
    found = list_checkpoints(run_dir) if step is None else [checkpoint_path(run_dir, step)]
    if not found or not found[-1].is_file():
        raise ConfigError(f"{key}={run_dir} has no checkpoint{f' at step {step}' if step else ''}; train it first")
    model = build_model(model_cfg).to(device)
    try:
        state = restore(found[-1], device, lambda state: model.load_state_dict(state["model"]))
    except CheckpointError as err:  # the source run's files are its own: say so, change nothing there
        raise ConfigError(
            f"{key}: {err}; relaunch the source run so it rewrites it "
            "(remove its summary.json first if that says completed)"
        ) from err
    model.eval()
    return model, state["step"]
