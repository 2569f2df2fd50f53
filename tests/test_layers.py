"""The layer contract (pyproject's [tool.importlinter]) catches an upward import, lazy ones included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root / "src")}  # the copy's package, not the installed one
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def _copy(root: Path) -> Path:
    """The package and its contract in `root`; the analysis (a link to the repo's analysis/) copied as files, so
    the copy is the package lint-imports reads. Returns the package folder."""
    shutil.copy(ROOT / "pyproject.toml", root)
    shutil.copytree(
        ROOT / "src" / "cart_sweeps",
        root / "src" / "cart_sweeps",
        ignore=shutil.ignore_patterns("__pycache__", "conf", "sweeps", "*.gz", "*.yaml", "out"),
    )
    assert _lint(root).returncode == 0, "the copy keeps the contract before anything is planted"
    return root / "src" / "cart_sweeps"


def test_a_planted_upward_import_breaks_the_contract_naming_it(tmp_path: Path) -> None:
    """A function-level import of the training loop from the model (domain -> run) fails the check, named."""
    _copy(tmp_path)
    params = tmp_path / "src" / "cart_sweeps" / "model" / "params.py"
    params.write_text(params.read_text() + "\n\ndef _planted() -> None:\n    import cart_sweeps.train.loop  # noqa\n")
    done = _lint(tmp_path)
    assert done.returncode != 0
    assert "cart_sweeps.model is not allowed to import cart_sweeps.train" in done.stdout
    assert "cart_sweeps.model.params -> cart_sweeps.train.loop" in done.stdout


def test_a_planted_type_only_cycle_breaks_the_contract_naming_it(tmp_path: Path) -> None:
    """An annotation's import (under `if TYPE_CHECKING:`) is a dependency too: the driver's module importing the
    expansion for a type, while the expansion imports the driver, is a cycle the check names."""
    package = _copy(tmp_path)
    expand = package / "sweep" / "expand.py"
    expand.write_text(
        expand.read_text()
        + "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        + "    from cart_sweeps.sweep.driver import StageDriver  # noqa\n"
    )
    done = _lint(tmp_path)
    assert done.returncode != 0
    assert "No cycles are allowed in cart_sweeps.sweep" in done.stdout
    assert ".expand -> .driver" in done.stdout or ".driver -> .expand" in done.stdout
