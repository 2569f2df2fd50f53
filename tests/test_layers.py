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


def test_a_planted_upward_import_breaks_the_contract_naming_it(tmp_path: Path) -> None:
    """A function-level import of the training loop from the model (domain -> run) fails the check, named."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    # The analysis is a link to the repo's analysis/: copied as files, so the copy is the package lint-imports reads.
    shutil.copytree(
        ROOT / "src" / "cart_sweeps",
        tmp_path / "src" / "cart_sweeps",
        ignore=shutil.ignore_patterns("__pycache__", "conf", "sweeps", "*.gz", "*.yaml", "out"),
    )
    assert _lint(tmp_path).returncode == 0, "the copy keeps the contract before anything is planted"
    params = tmp_path / "src" / "cart_sweeps" / "model" / "params.py"
    params.write_text(params.read_text() + "\n\ndef _planted() -> None:\n    import cart_sweeps.train.loop  # noqa\n")
    done = _lint(tmp_path)
    assert done.returncode != 0
    assert "cart_sweeps.model is not allowed to import cart_sweeps.train" in done.stdout
    assert "cart_sweeps.model.params -> cart_sweeps.train.loop" in done.stdout
