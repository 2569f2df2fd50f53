"""The analysis has one name, cart_sweeps.analysis (the wheel's): no module of it is ever loaded twice, under
`analysis.*` and `cart_sweeps.analysis.*` (two TABLES, two AnalysisError), whatever a process imports first.
A checkout's `python -m analysis` runs the same package (analysis/alias.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from cart_sweeps.config import REPO_ROOT

# The files loaded as more than one module object (the same file under two names), printed last.
TWICE = """
from pathlib import Path
ids = {}
for key, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and key.split(".")[0] in ("analysis", "cart_sweeps"):
        ids.setdefault(str(Path(path).resolve()), set()).add(id(module))
print(json.dumps(sorted(f for f, i in ids.items() if len(i) > 1)))
"""
# Every analysis module (what the tests import among them), then the checkout's name of some, in both orders.
BOTH = """
import importlib, json, pkgutil, sys
import cart_sweeps.analysis as one
names = [m.name for m in pkgutil.iter_modules(one.__path__) if m.name not in {"__main__", "alias"}]
for package in ORDER:
    for name in names:
        importlib.import_module(package + "." + name)
import analysis, analysis.load
import cart_sweeps.analysis.registry as registry, cart_sweeps.analysis.errors as errors
from cart_sweeps.analysis.registry import TABLES
from cart_sweeps.analysis.errors import AnalysisError
same = [analysis is one, analysis.load is one.load, TABLES is registry.TABLES, AnalysisError is errors.AnalysisError]
print(json.dumps([same, len(names)]))
"""
SHIM = """
import json, runpy, sys
sys.argv = ["analysis", "--help"]
try:
    runpy.run_module("analysis", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """Python from the repository root, whose folder analysis/ is importable as `analysis` there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])}
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_no_analysis_module_is_loaded_under_two_names():
    for order in ('["cart_sweeps.analysis", "analysis"]', '["analysis", "cart_sweeps.analysis"]'):
        done = _run("-c", BOTH.replace("ORDER", order) + TWICE)
        assert done.returncode == 0, done.stderr
        said, twice = done.stdout.strip().splitlines()
        assert json.loads(twice) == [], order
        same, modules = json.loads(said)
        assert same == [True] * 4 and modules >= 15, order


def test_the_tests_import_the_one_name():
    """No test imports the analysis by its checkout name (the suite's pythonpath no longer holds the root)."""
    for path in sorted((REPO_ROOT / "tests").rglob("*.py")):
        if path.name != "test_analysis_name.py":
            assert not re.search(r"^\s*(from analysis[. ]|import analysis\b)", path.read_text(), re.M), path


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_python_m_analysis_from_a_checkout_runs_the_one_package():
    """`python -m analysis` (the checkout's shim, as runpy runs it) is `python -m cart_sweeps.analysis`, and loads
    no module twice (test_readme runs both commands' --help as typed)."""
    done = _run("-c", SHIM + TWICE)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m cart_sweeps.analysis" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
