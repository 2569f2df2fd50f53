"""Shared fixtures: every test composes the real conf/ and sweeps/ trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from stages import run_quick_demo

from cart_sweeps.compose import compose_config

# The `slurm_cluster` fixture: a real single-node SLURM cluster, or a clean skip where none runs.
pytest_plugins = ["slurm.fixtures"]

# Tests never reach the hub: the default and the tests run on the embedded corpus.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# One torch thread in each test process and each single run it starts: the tiers run more processes than cores
# (xdist workers, each with its runs), where a run's second OpenMP thread spins waiting on a core another process
# holds. A 20-step run under the slow tier's load: 183 s (36 s of CPU) at torch's default 2 threads, 27 s (5.6 s)
# at 1, the same metrics. A stage's runs keep the pool's own share (cores / slots: sweep/pools/local.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that read the quick demo (minutes) or need the SLURM cluster are in the full tier only.

    Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`) each of the two shares one worker: the
    quick demo is then made once, and the SLURM tests, which read the one cluster's queue, run one at a time."""
    for item in items:
        shared = "quick_demo" if "quick_demo" in getattr(item, "fixturenames", ()) else None
        shared = "slurm" if item.get_closest_marker("slurm") else shared
        if shared:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.xdist_group(shared))
        elif item.get_closest_marker("slow") and builds_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def builds_module_fixture(item: pytest.Item) -> bool:
    """Whether a slow test reads a module-scoped fixture of its own module (real stages, a minute or more).

    Grouped by module, its tests share one worker, so the fixture is built once, not once per worker."""
    module = item.nodeid.split("::")[0]
    definitions = getattr(item, "_fixtureinfo", None)
    defs = definitions.name2fixturedefs.values() if definitions else ()
    return any(d.scope == "module" and d.baseid == module for chain in defs for d in chain)


@pytest.fixture
def compose():
    """compose(overrides) -> the DictConfig `python -m cart_sweeps <overrides>` would run."""
    return compose_config


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """One embedded-corpus cache, so its bins are prepared once (under the preparer's lock, which makes the others
    wait): $CART_TEST_DATA_CACHE where set (`make test-full`: both tiers), else the session's, its workers' one."""
    shared = os.environ.get("CART_TEST_DATA_CACHE")
    base = tmp_path_factory.getbasetemp()  # a worker's is inside the session's (pytest-xdist)
    path = Path(shared) if shared else (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "data-cache"
    path.mkdir(parents=True, exist_ok=True)
    os.environ["CART_SWEEPS_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory, data_cache):
    """`python -m cart_sweeps.demo --quick` in a fresh folder: the study's seams end to end."""
    root = tmp_path_factory.mktemp("demo")
    return root, run_quick_demo(root)
