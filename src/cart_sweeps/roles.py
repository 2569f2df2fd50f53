"""Which stage plays each part of the paper's study, read from every config source.

A stage file may claim a `role:`: the analysis then tables its runs in the paper tables that read that role
(analysis/registry.py), and the demo runs the paper's roles (StageRole) with each stage's `quick:` overrides.
A role is an open name, so a new table's stage names its own; a near miss of a paper role (`scren`) is refused
here as a typo, and a role no table reads is refused by the analysis, which knows the tables. Stages come from
the shipped sweeps/ and from the user's config folders (`--config-dir DIR`, `hydra.searchpath`:
DIR/stage/*.yaml), so a role is checked across all of them: one stage per role.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.compose import config_dirs
from cart_sweeps.config import ConfigError
from cart_sweeps.options import StageRole
from cart_sweeps.register import stage_paths


@dataclass(frozen=True)
class StageFile:
    name: str
    path: Path
    role: str | None
    quick: list[str] = field(default_factory=list)  # the demo's --quick overrides (StageConfig.quick)


def stage_files() -> list[StageFile]:
    """Every stage file this command can compose: sweeps/*.yaml, then each config folder's stage/*.yaml."""
    return [_read(path) for path in stage_paths(config_dirs())]


def _read(path: Path) -> StageFile:
    node = OmegaConf.load(path)
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: a stage file is a mapping (name:, grid:, recipe:, ...)")
    role = node.get("role")
    if role is not None and role not in StageRole.__members__:
        misspelt = difflib.get_close_matches(str(role), list(StageRole), n=1)
        if misspelt or not re.fullmatch(r"[a-z][a-z0-9_]*", str(role)):
            allowed = ", ".join(StageRole)
            raise ConfigError(f"{path}: role: {role} is no role of the study; use one of {allowed}, or leave role out")
    quick = [str(o) for o in node.get("quick", [])]
    return StageFile(str(node.get("name", path.stem)), path, str(role) if role is not None else None, quick)


def stage_roles() -> dict[str, StageFile]:
    """Role -> the one stage file claiming it; two claiming one role is one line naming both files."""
    out: dict[str, StageFile] = {}
    for stage in stage_files():
        if stage.role is None:
            continue
        if (first := out.get(stage.role)) is not None and first.name != stage.name:
            raise ConfigError(
                f"stages {first.name} ({first.path}) and {stage.name} ({stage.path}) both claim role: {stage.role}; "
                "a role is one stage's: remove `role:` from one of them"
            )
        out[stage.role] = stage
    return out


def stage_of(role: str) -> str:
    """The name of the stage playing `role` (the shipped one unless a user's stage took it)."""
    roles = stage_roles()
    if role not in roles:
        raise ConfigError(f"no stage claims role: {role}; add `role: {role}` to one stage file")
    return roles[role].name
