"""One registry style: a choice (a model, a logger, a launcher's pool) names its class by a dotted path, imported
on first use, so that nothing a run does not choose is imported (torch, W&B, submitit)."""

from __future__ import annotations

import importlib
from typing import Any

from cart_sweeps.config import ConfigError


def load(path: str, key: str) -> Any:
    """The class `path` names; `key` names the setting in the one line a path that names nothing gives."""
    module, _, name = path.rpartition(".")
    wrong = ConfigError(f"{key}={path} is no importable class: check its spelling")
    try:  # not hydra.utils.get_class: it logs its own multi-line error before raising
        found = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or not module.startswith(err.name):  # a module the named one imports is missing
            raise
        raise wrong from err
    except ValueError as err:  # no module part at all
        raise wrong from err
    if not hasattr(found, name):
        raise wrong
    return getattr(found, name)
