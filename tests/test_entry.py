"""The one registry style (cart_sweeps.entry): a misspelled path is one line; a broken module is not hidden."""

from __future__ import annotations

import sys

import pytest

from cart_sweeps.config import ConfigError
from cart_sweeps.entry import load
from cart_sweeps.sweep.pools.local import LocalPool


def test_a_path_names_its_class() -> None:
    assert load("cart_sweeps.sweep.pools.local.LocalPool", "launcher._target_") is LocalPool


@pytest.mark.parametrize("path", ["nowhere.Pool", "cart_sweeps.sweep.pools.local.NoPool", "LocalPool"])
def test_a_path_that_names_nothing_is_one_line(path: str) -> None:
    with pytest.raises(ConfigError, match=rf"^logger.name={path} is no importable class: check its spelling$"):
        load(path, "logger.name")


def test_a_module_whose_own_import_fails_says_so(tmp_path, monkeypatch) -> None:
    (tmp_path / "broken_entry.py").write_text("import no_such_dependency_here\nclass Logger: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_here"):
        load("broken_entry.Logger", "logger.name")
    sys.modules.pop("broken_entry", None)
