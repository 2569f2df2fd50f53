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
        raise ConfigError(first_line(err)) from err


def first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


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
