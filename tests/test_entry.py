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


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["launcher=slurm", "launcher.gpus_per_task=abc"], r"^launcher\.gpus_per_task: Value 'abc' .* could not be "),
        (["launcher=slurm", "+launcher.gpus_per_tsk=1"], r"did you mean launcher\.gpus_per_task\?$"),
        (["~launcher.slots"], r"^launcher\.slots has no value: set it in conf/launcher/"),
        (["launcher=slurm", "launcher.mem_gb=0"], r"^launcher\.mem_gb=0 must be >= 1$"),
    ],
)
def test_a_launcher_setting_its_pool_cannot_take_is_one_line(overrides: list[str], says: str) -> None:
    """The pool module types its launcher's settings (Pool.settings_of, run by preflight before any launch)."""
    from cart_sweeps.compose import compose_config
    from cart_sweeps.sweep.pool import pool_class

    launcher = compose_config(overrides).launcher
    with pytest.raises(ConfigError, match=says) as err:
        pool_class(launcher).settings_of(launcher)
    assert "\n" not in str(err.value)


def test_each_launcher_yaml_gives_every_setting_its_pool_declares() -> None:
    from cart_sweeps.compose import compose_config
    from cart_sweeps.sweep.pool import pool_class

    for name in ("local", "slurm"):  # typing adds nothing and changes no value
        launcher = compose_config([f"launcher={name}"]).launcher
        assert pool_class(launcher).settings_of(launcher) == launcher
