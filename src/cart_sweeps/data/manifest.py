"""manifest.json of a prepared recipe folder: what was built, from what, and how to check it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from cart_sweeps.config import DataConfig
from cart_sweeps.data.errors import DataError
from cart_sweeps.data.hashes import stored_sha256
from cart_sweeps.data.recipe import as_config, recipe_dir, recipe_hash

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"


def _broken(recipe: str, folder: Path, what: str) -> DataError:
    return DataError(
        f"data={recipe}: {what}; delete {folder} and run `python -m cart_sweeps.data.prepare data={recipe}`"
    )


def read_manifest(folder: Path, recipe: str, digest: str) -> dict[str, Any]:
    """The folder's manifest, after checking it belongs to this recipe (by hash)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        raise _broken(recipe, folder, f"{folder / MANIFEST} is missing or unreadable") from None
    if (found := manifest.get("recipe_hash")) != digest:
        raise _broken(recipe, folder, f"{folder / MANIFEST} is for recipe hash {found}, not {digest}")
    return manifest


def bins(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """'train' and every validation set -> its bin's entry (file, tokens, sha256)."""
    return {"train": manifest["train"], **manifest["validation"]}


def check_bin(folder: Path, entry: dict[str, Any], recipe: str) -> Path:
    """The bin's path, after checking it exists and holds exactly the manifest's tokens and sha256."""
    path = folder / entry["file"]
    if not path.is_file():
        raise _broken(recipe, folder, f"{path} is missing")
    size = path.stat().st_size
    if size % 2 or size // 2 != entry["tokens"]:
        tokens = f"{size:,} bytes, the manifest says {entry['tokens']:,} uint16 tokens"
        raise _broken(recipe, folder, f"{path} is truncated or corrupt ({tokens})")
    if stored_sha256(path) != entry["sha256"]:
        raise _broken(recipe, folder, f"{path} is not what was prepared (its sha256 differs from the manifest's)")
    return path


def checked_recipe(cfg: DictConfig) -> tuple[Path, dict[str, Any], dict[str, Path]]:
    """A prepared recipe's folder, its manifest, and its bins' paths, each bin checked against the manifest."""
    digest = recipe_hash(cfg)
    folder = recipe_dir(cfg, digest)
    manifest = read_manifest(folder, cfg.name, digest)
    return folder, manifest, {name: check_bin(folder, entry, cfg.name) for name, entry in bins(manifest).items()}


def check_prepared(data_cfg: DictConfig | DataConfig) -> None:
    """A prepared recipe whose bins changed since raises DataError (one never prepared is left to its first run):
    preflight calls it, and a warm worker before forking, so its runs inherit the checked sha256s."""
    cfg = as_config(data_cfg)
    if recipe_dir(cfg, recipe_hash(cfg)).exists():
        checked_recipe(cfg)
