"""A data recipe's identity: the hash that names its cache folder, of what changes the bins (the content of
local input files included), not of where or how they are built (cache_dir, streaming)."""

from __future__ import annotations

import glob
import hashlib
import json
import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import DataConfig
from cart_sweeps.data.errors import DataError
from cart_sweeps.data.hashes import stored_sha256

PREP_VERSION = 1  # bump when prepare's output changes for the same recipe
LOCAL_BUILDERS = {"json", "parquet", "csv", "text", "arrow"}  # `datasets` builders that read local files
_NOT_IN_HASH = {"name", "cache_dir", "streaming"}
_FULL_HASH_LIMIT = 256 << 20  # larger local inputs are fingerprinted by name and size only


def hub_offline() -> bool:
    """Whether the HF offline variables are set (a hub fetch then fails at once), read without importing `datasets`."""
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


def as_config(data_cfg: DictConfig | DataConfig) -> DictConfig:
    return data_cfg if isinstance(data_cfg, DictConfig) else OmegaConf.structured(data_cfg)


def resolve_dir(data_dir: str | None) -> str | None:
    """`pkg://package/sub/dir` -> that folder inside the installed package; other values pass through."""
    if data_dir is None or not data_dir.startswith("pkg://"):
        return data_dir
    package, _, sub = data_dir.removeprefix("pkg://").partition("/")
    spec = find_spec(package)
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / sub).is_dir():
            return str(Path(root) / sub)
    raise DataError(f"data_dir={data_dir}: no such folder in an installed package")


def local_files(spec: DictConfig) -> list[str]:
    """The local files a local builder reads: a plain glob (every run hashes its recipe; `datasets` imports slowly)."""
    if spec.path not in LOCAL_BUILDERS or not spec.data_files:
        return []
    base = resolve_dir(spec.data_dir) or str(Path.cwd())
    return sorted({f for pattern in spec.data_files for f in glob.glob(os.path.join(base, pattern), recursive=True)})


def _fingerprint(path: str) -> str:
    """The file's sha256, once per process per version of it (size alone past _FULL_HASH_LIMIT)."""
    size = Path(path).stat().st_size
    return f"size:{size}" if size > _FULL_HASH_LIMIT else stored_sha256(Path(path))


def _without_unpinned(spec: dict[str, Any]) -> dict[str, Any]:
    """A source without `revision: None`: recipes from before revisions existed keep their hash (and folder)."""
    return {k: v for k, v in spec.items() if not (k == "revision" and v is None)}


def recipe_content(cfg: DictConfig) -> dict[str, Any]:
    """Everything that determines the bins, as plain data (an unpinned revision left out), local inputs by content."""
    node = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    content = {k: v for k, v in node.items() if k not in _NOT_IN_HASH}
    content["tokenizer"] = _without_unpinned(content["tokenizer"])
    for key in ("sources", "validation"):
        content[key] = [_without_unpinned(spec) for spec in content[key]]
    inputs = {Path(p).name: _fingerprint(p) for spec in [*cfg.sources, *cfg.validation] for p in local_files(spec)}
    return {"version": PREP_VERSION, "recipe": content, "inputs": inputs}


def recipe_hash(cfg: DictConfig) -> str:
    blob = json.dumps(recipe_content(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def recipe_dir(cfg: DictConfig, digest: str) -> Path:
    return Path(cfg.cache_dir) / f"{cfg.name}-{digest}"
