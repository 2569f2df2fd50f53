"""Compose the config outside `@hydra.main` (runs launched by the sweeper, plan, bench, tests)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from cart_sweeps.config import CONF_DIR, ConfigError, register_configs

T = TypeVar("T")


def quote_stage(argv: Sequence[str]) -> list[str]:
    """`stage=1` -> `stage='1'`: Hydra reads an unquoted 1 as an int, which is no group option."""
    return [re.sub(r"^(\+{0,2}stage)=(\d\w*)$", r"\1='\2'", a) for a in argv]


def compose_config(overrides: Sequence[str] = (), hydra_config: bool = False) -> DictConfig:
    """The config `python -m cart_sweeps <overrides>` would run, composed from the real conf/ tree.

    Hydra's own composition errors (unknown key, wrong type, missing group option) become ConfigError.
    """
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            return compose("config", overrides=quote_stage(overrides), return_hydra_config=hydra_config)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(describe(err)) from err


def first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def describe(err: BaseException) -> str:
    """One line from Hydra's multi-line errors: what failed, why (the root cause), what is allowed."""
    parts = [first_line(err)]
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    if root is not err:
        parts.append(first_line(root))
    text = str(err)
    if "Available options" in text:
        options = text.split("Available options", 1)[1].split("Config search path", 1)[0]
        parts.append("available: " + ", ".join(o.strip() for o in options.splitlines()[1:] if o.strip()))
    if "To append to your config use" in text:
        parts.append(text.split("To append to your config use", 1)[1].strip().splitlines()[0] + " adds a new key")
    return "; ".join(parts)


def run_cli(main: Callable[[list[str]], T], usage: str, argv: Sequence[str] | None = None) -> T | None:
    """Run a command-line entry point: --help prints `usage`; a config error is one line and exit 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        print(usage)
        return None
    try:
        return main(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
