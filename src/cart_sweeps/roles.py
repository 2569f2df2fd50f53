"""Which stage plays each part of the paper's study (its `role:`), one stage per role across every config source.

A role is an open name (a new table's stage names its own); a near miss of a paper role is refused as a typo.
Each file's top-level `name:` and `role:` alone are read: one that cannot be read is skipped with a warning, so
a broken sibling never stops another stage's command.
"""

from __future__ import annotations

import difflib
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cart_sweeps import stagefile
from cart_sweeps.compose import config_dirs
from cart_sweeps.config import ConfigError
from cart_sweeps.options import StageRole
from cart_sweeps.register import stage_paths


@dataclass(frozen=True)
class StageFile:
    name: str
    path: Path
    role: str | None

    def quick(self) -> list[str]:
        """The demo's --quick overrides (StageConfig.quick): the whole file read, this stage's alone."""
        node = stagefile.load(self.path)
        return [str(o) for o in (node.get("quick") or [])] if isinstance(node, dict) else []


def stage_files() -> list[StageFile]:
    """Every stage file this command can compose that can be read: sweeps/*.yaml, then each DIR/stage/*.yaml."""
    return [f for path in stage_paths(config_dirs()) if (f := _head(path)) is not None]


def _head(path: Path) -> StageFile | None:
    try:
        head: dict[str, Any] = stagefile.top_level(path, ("name", "role"))
    except ConfigError as err:
        _warn(f"{err} (skipped when finding which stage plays each role)")
        return None
    role = head.get("role")
    return StageFile(str(head.get("name", path.stem)), path, str(role) if role is not None else None)


@functools.cache  # once a process: a command reads the roles more than once
def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _check_spelling(where: str, role: str) -> None:
    """A near miss of a paper role (or no name at all) is a typo: one line naming the roles."""
    if role not in StageRole.__members__:
        misspelt = difflib.get_close_matches(role, list(StageRole), n=1)
        if misspelt or not re.fullmatch(r"[a-z][a-z0-9_]*", role):
            allowed = ", ".join(StageRole)
            raise ConfigError(f"{where}: role: {role} is no role of the study; use one of {allowed}, or leave role out")


def _refuse_shared(role: str, first: StageFile, second: StageFile) -> ConfigError:
    return ConfigError(
        f"stages {first.name} ({first.path}) and {second.name} ({second.path}) both claim role: {role}; "
        "a role is one stage's: remove `role:` from one of them"
    )


def check_claim(stage: str, option: str, role: str | None) -> None:
    """The role the stage `stage` (its file `option`) runs with: spelt as a role, and no other stage's."""
    if role is None:
        return
    files = stage_files()
    own = next((f.path for f in reversed(files) if f.path.stem == option), None)
    _check_spelling(str(own) if own else f"stage {stage}", role)
    claimants = [f for f in files if f.role == role]
    if other := next((f for f in claimants if f.name != stage), None):
        mine = next((f for f in claimants if f.name == stage), None)
        if mine is None:  # its role set by an override (stage.role=...), not by its file
            raise _refuse_shared(role, other, StageFile(stage, own or Path(option), role))
        first, second = sorted((other, mine), key=claimants.index)  # in the order the files are found
        raise _refuse_shared(role, first, second)


def stage_roles() -> dict[str, StageFile]:
    """Role -> the one stage file claiming it; two claiming one role is one line naming both files."""
    out: dict[str, StageFile] = {}
    for stage in stage_files():
        if stage.role is None:
            continue
        _check_spelling(str(stage.path), stage.role)
        if (first := out.get(stage.role)) is not None and first.name != stage.name:
            raise _refuse_shared(stage.role, first, stage)
        out[stage.role] = stage
    return out


def stage_of(role: str) -> str:
    """The name of the stage playing `role` (the shipped one unless a user's stage took it)."""
    roles = stage_roles()
    if role not in roles:
        raise ConfigError(f"no stage claims role: {role}; add `role: {role}` to one stage file")
    return roles[role].name
