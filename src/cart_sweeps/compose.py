"""Compose the config outside `@hydra.main` (runs launched by the sweeper, plan, bench, tests)."""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cart_sweeps import collector, stagefile
from cart_sweeps.config import CONF_DIR, ConfigError
from cart_sweeps.register import file_mistake, refuse_shadowing, register_configs
from cart_sweeps.text import first_line

T = TypeVar("T")

# The command's own config sources (--config-dir, --config-name, hydra.searchpath), kept in the environment so
# that every composition sees them, its jobs' included (they inherit the driver's environment).
SEARCHPATH_ENV = "CART_SWEEPS_SEARCHPATH"
CONFIG_NAME_ENV = "CART_SWEEPS_CONFIG_NAME"
_PARSER = OverridesParser.create()


def parse_overrides(overrides: Sequence[str]) -> list[Override]:
    """Hydra's parse of a command line's overrides (`stage=1` quoted: quote_stage); a mistake is one line."""
    try:
        return [parse_override(o) for o in quote_stage(overrides)]
    except HydraException as err:
        raise ConfigError(describe(err)) from err


@functools.cache
def parse_override(text: str) -> Override:
    """One override through Hydra's grammar, once per process: its readers only read an Override."""
    return _PARSER.parse_overrides([text])[0]


def use_config_sources(config_dir: str | None, config_name: str | None, parsed: Sequence[Override]) -> None:
    """Make this command's --config-dir, --config-name and `hydra.searchpath=[...]` reach every composition."""
    paths = searchpath()
    if config_dir is not None:
        folder = Path(config_dir).resolve()
        if not folder.is_dir():
            raise ConfigError(f"--config-dir {config_dir}: no such folder")
        paths.append(f"file://{folder}")
    for o in parsed:
        if o.get_key_element() == "hydra.searchpath":
            value = o.value()
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{o.input_line}: hydra.searchpath takes a list, e.g. hydra.searchpath=[file:///DIR]")
            paths.extend(_absolute(v) for v in value)
    if paths:
        os.environ[SEARCHPATH_ENV] = json.dumps(list(dict.fromkeys(paths)))
    if config_name is not None:
        os.environ[CONFIG_NAME_ENV] = config_name


def _absolute(entry: str) -> str:
    """A `file://` entry made absolute (a job may start elsewhere); `pkg://` entries are left as they are."""
    if entry.startswith("file://"):
        return f"file://{Path(entry.removeprefix('file://')).resolve()}"
    return entry


def searchpath() -> list[str]:
    """The command's own config sources beside conf/ (Hydra search path entries)."""
    return json.loads(os.environ.get(SEARCHPATH_ENV, "[]"))


def config_dirs() -> list[Path]:
    """conf/, then the user's config folders: where config groups and their options are found."""
    return [CONF_DIR, *(Path(p.removeprefix("file://")) for p in searchpath() if p.startswith("file://"))]


def user_stage_files(overrides: Sequence[str]) -> list[Path]:
    """The files DIR/stage/mine.yaml of the user's config folders that `stage=mine` in `overrides` could read."""
    chosen = (o for o in map(parse_override, quote_stage(overrides)) if o.key_or_group == "stage")
    names = [o.value() for o in chosen if not o.is_delete()]
    if not names or names[-1] is None:
        return []
    found = (folder / "stage" / f"{names[-1]}.yaml" for folder in config_dirs()[1:])
    return [path for path in found if os.path.lexists(path)]


def quote_stage(argv: Sequence[str]) -> list[str]:
    """`stage=1` -> `stage='1'`: Hydra reads an unquoted 1 as an int, which is no group option."""
    return [re.sub(r"^(\+{0,2}stage)=(\d\w*)$", r"\1='\2'", a) for a in argv]


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The config `python -m cart_sweeps <overrides>` would run; Hydra's composition errors become ConfigError."""
    register_configs()
    for path in user_stage_files(overrides):
        stagefile.check(path)  # a FIFO, an alias bomb, a YAML mistake: one line, before Hydra reads it
        refuse_shadowing(path)
    GlobalHydra.instance().clear()
    name = os.environ.get(CONFIG_NAME_ENV, "config")  # the user's folders: hydra_plugins/.../searchpath.py
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            return compose(name, overrides=quote_stage(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_unknown_setting(err, overrides) or describe(err)) from err


_NOT_OVERRIDDEN = re.compile(r"Could not override '([^']+)'")


def _unknown_setting(err: BaseException, overrides: Sequence[str]) -> str | None:
    """`model.n_loop=6` -> `did you mean model.n_loops?`, found in the config the other overrides compose (Hydra's
    own advice, `+model.n_loop=6`, stays only under free-form nodes: the schema refuses new keys elsewhere)."""
    if not (match := _NOT_OVERRIDDEN.search(str(err))):
        return None
    key = match.group(1)
    given = [o for o in overrides if re.match(rf"^[+~]*{re.escape(key)}=", o)]
    try:
        node = root = compose_config([o for o in overrides if o not in given])
    except ConfigError:
        return None
    parts = key.split(".")
    for i, part in enumerate(parts):
        names = [str(k) for k in node.keys()]
        if part in names and (child := _settings_under(node, part)) is not None:
            node = child
            continue
        if part in names:  # a value, not a node: nothing can be set under it
            return f"{key}: {'.'.join(parts[: i + 1])} is a value, not a group of settings"
        where = ".".join(parts[:i])
        if ending := _ending_in(root, parts[i:]):  # `lr=1e-3`: the setting is trainer.lr
            value = given[-1].partition("=")[2] if given else None
            spelt = " or ".join(f"{m}={value}" if value is not None else m for m in ending[:3])
            return f"{key}: {where or 'the config'} has no setting {part}; did you mean {spelt}?"
        if close := difflib.get_close_matches(part, names, n=1):
            meant = ".".join([*parts[:i], close[0], *parts[i + 1 :]])
            return f"{key}: {where or 'the config'} has no setting {part}; did you mean {meant}?"
        if OmegaConf.get_type(node) in (dict, None):
            return None  # a free-form node: + adds the key
        listing = f"python -m cart_sweeps --cfg job{f' -p {where}' if where else ''}"
        return f"{key}: {where or 'the config'} has no setting {part} (`{listing}` lists them)"
    return None


def _ending_in(node: DictConfig, tail: list[str]) -> list[str]:
    """The settings of `node` whose key ends in the parts `tail` (`lr` -> trainer.lr), shallowest first."""
    found = [key for key in _keys(node) if key.split(".")[-len(tail) :] == tail and key.count(".") >= len(tail)]
    return sorted(found, key=lambda key: key.count("."))


def _keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every setting under `node`, dotted: the schema's keys, not a free-form mapping's (a stage's grid)."""
    if OmegaConf.get_type(node) in (dict, None):
        return []
    keys: list[str] = []
    for name in map(str, node.keys()):
        keys.append(key := f"{prefix}{name}")
        if (child := _settings_under(node, name)) is not None:
            keys += _keys(child, f"{key}.")
    return keys


def _settings_under(node: DictConfig, name: str) -> DictConfig | None:
    """The child `name` of `node` when it is a node of settings as written (not a value, interpolation, ??? or None)."""
    if OmegaConf.is_missing(node, name) or OmegaConf.is_interpolation(node, name):
        return None
    child = node[name]
    return child if isinstance(child, DictConfig) else None


def _option_advice(text: str, options: list[str]) -> str:
    """`stage=paritty` -> `did you mean stage=parity?`, then every option of the group."""
    listing = "available: " + ", ".join(options)
    if not (missing := re.search(r"Could not find '(?:.*/)?([^'/]+)/([^'/]+)'", text)):
        return listing
    group, name = missing.groups()
    if close := difflib.get_close_matches(name, options, n=1):
        return f"did you mean {group}={close[0]}? ({listing})"
    if mine := config_dirs()[1:]:
        return f"{listing}; no {group}/{name}.yaml in {', '.join(map(str, mine))} either"
    return f"{listing}; a {group} of your own: DIR/{group}/{name}.yaml, found with --config-dir DIR"


_COMPOSING = re.compile(r"^In '([^']+)': \w+ raised while composing config:\s*\n(.*)", re.DOTALL)


def _config_file(name: str) -> str:
    """Where the config `name` (`stage/mine`, `config`) is read from: its file in a config folder, else its name."""
    found = (folder / f"{name}.yaml" for folder in config_dirs())
    return str(next((path for path in found if path.is_file()), f"'{name}'"))


def describe(err: BaseException) -> str:
    """One line from Hydra's multi-line errors: what failed, the root cause, what is allowed."""
    if composing := _COMPOSING.match(str(err)):
        name, complaint = composing.groups()
        return file_mistake(complaint, _config_file(name), package=name.rpartition("/")[0].replace("/", "."))
    parts = [first_line(err)]
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    if root is not err:
        parts.append(first_line(root))
    text = str(err)
    if "Available options" in text:
        options = text.split("Available options", 1)[1].split("Config search path", 1)[0]
        parts.append(_option_advice(text, [o.strip() for o in options.splitlines()[1:] if o.strip()]))
    if "To append to your config use" in text:
        parts.append(text.split("To append to your config use", 1)[1].strip().splitlines()[0] + " adds a new key")
    return "; ".join(parts)


def run_cli(main: Callable[[list[str]], T], usage: str, argv: Sequence[str] | None = None) -> T | None:
    """Run a command-line entry point: --help prints `usage`; a config error is one line and exit 2; Hydra's
    --config-dir/-cd, --config-name/-cn and hydra.searchpath=[...] work as under `python -m cart_sweeps`."""
    collector.skip_final_collection()
    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        print(usage)
        return None
    try:
        parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # Hydra's flags naming config sources
        parser.add_argument("--config-dir", "-cd")
        parser.add_argument("--config-name", "-cn")
        flags, overrides = parser.parse_known_args(args)
        if unknown := [a for a in overrides if a.startswith("-")]:
            raise ConfigError(
                f"{unknown[0]}: unknown flag; this command takes overrides, --config-dir and --config-name"
            )
        use_config_sources(flags.config_dir, flags.config_name, parse_overrides(overrides))
        return main(overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
