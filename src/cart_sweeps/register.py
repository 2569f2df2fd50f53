"""What Hydra and OmegaConf must know before composing (the schema, the shipped stages, a resolver): registered
by whatever composes, never at import; and a config file's mistake as the one line a user reads."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Sequence
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cart_sweeps import config
from cart_sweeps.adapters.omegaconf import cache_interpolation_parses
from cart_sweeps.config import SWEEPS_DIR, Config, ConfigError, StageConfig
from cart_sweeps.naming import run_dir


@functools.cache  # once per process: each composition calls it (0.3 s apiece)
def register_configs() -> None:
    """Register the root schema, sweeps/*.yaml as the `stage` group, the run_dir resolver and the parse cache."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for path in stage_paths():
        try:
            stage = OmegaConf.merge(OmegaConf.structured(StageConfig), OmegaConf.load(path))
        except OmegaConfBaseException as err:  # a misspelt key, one value where a list goes: one line
            raise ConfigError(file_mistake(str(err), str(path))) from err
        cs.store(group="stage", name=path.stem, node=stage, package="stage")
    OmegaConf.register_new_resolver("run_dir", lambda *, _root_: str(run_dir(_root_)), replace=True)
    cache_interpolation_parses()


def stage_paths(config_dirs: Sequence[Path] = ()) -> list[Path]:
    """Every stage file, once: the shipped sweeps/*.yaml, then each config folder's stage/*.yaml."""
    paths = sorted(SWEEPS_DIR.glob("*.yaml"))
    for folder in config_dirs:
        paths += sorted((folder / "stage").glob("*.yaml"))
    return list(dict.fromkeys(p.resolve() for p in paths))


def refuse_shadowing(path: Path) -> None:
    """A user's stage file named as a shipped one: Hydra would merge it onto the shipped stage stored under that
    name (automatic schema matching), so the shipped settings would leak into it."""
    if (SWEEPS_DIR / path.name).is_file():
        raise ConfigError(
            f"{path}: a shipped stage is named {path.stem} too (sweeps/{path.name}); rename your file and its name: "
            f"(stage/my_{path.stem}.yaml, run as stage=my_{path.stem}); `defaults: [{path.stem}, _self_]` in it "
            "starts from the shipped one"
        )


_UNKNOWN = re.compile(r"^Key '([^']+)' not in '(\w+)'")
_ONE_VALUE = re.compile(r"^Value (.+) \(\w+\) is incompatible with type hint '[\w.]*List\b")
_MAPPING = re.compile(r"^'DictConfig' is incompatible with type hint '[\w.]*List\b")
_FULL_KEY = re.compile(r"^\s*full_key: (\S+)", re.MULTILINE)


def file_mistake(text: str, where: str, package: str = "") -> str:
    """One line for OmegaConf's error `text` about the file `where`, whose content sits at `package` of the config:
    read from its text, as Hydra passes on no more of the error ("Key 'reicpe' not in 'StageConfig'")."""
    message = next((line.strip() for line in text.splitlines() if line.strip()), text)
    full = _FULL_KEY.search(text)
    key = full.group(1).removeprefix(f"{package}.") if full else None
    if unknown := _UNKNOWN.match(message):
        name, schema = unknown.groups()
        parent = key.rpartition(".")[0] if key else ""
        found = getattr(config, schema, None)  # a schema dataclass of cart_sweeps.config, or another type
        known = [f.name for f in dataclasses.fields(found)] if dataclasses.is_dataclass(found) else []
        if close := difflib.get_close_matches(name, known, n=1):
            fix = f"did you mean {'.'.join(filter(None, [parent, close[0]]))}?"
        else:
            fix = f"the settings there: {', '.join(known)}" if known else "check its spelling"
        return f"{where}: {key or name} is no setting; {fix}"
    if key and (one := _ONE_VALUE.match(message)):
        return f"{where}: {key}: {one.group(1)} is one value where a list is wanted: write [{one.group(1)}]"
    if key and _MAPPING.match(message):
        axis = " (a grid axis is one dotted key: model.n_loops: [2, 4])" if key.startswith("grid.") else ""
        return f"{where}: {key}: a mapping where a list is wanted{axis}"
    return f"{where}: {key}: {message}" if key else f"{where}: {message}"
