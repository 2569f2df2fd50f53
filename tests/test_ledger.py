"""The ledger file under concurrent openers: a driver starting while `plan`, the dashboard or a test reads."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from cart_sweeps.sweep.ledger import Ledger


def open_when_released(sweep_dir: str, barrier) -> None:
    barrier.wait()
    Ledger.open(Path(sweep_dir), "1", "sqlite")


@pytest.mark.slow  # a race, tried 8 times with 8 processes: the full tier
def test_processes_opening_a_new_ledger_at_once_all_succeed(tmp_path):
    """Optuna creates SQLite tables check-then-create; unguarded, about one opener in five failed."""
    spawn = multiprocessing.get_context("spawn")
    for attempt in range(8):
        sweep_dir = tmp_path / str(attempt)
        barrier = spawn.Barrier(3)
        procs = [spawn.Process(target=open_when_released, args=(str(sweep_dir), barrier)) for _ in range(3)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(120)
        assert [proc.exitcode for proc in procs] == [0, 0, 0], f"attempt {attempt}: an opener failed"
        assert Ledger.read(sweep_dir, "1", "sqlite") is not None  # one study "1", readable
        assert [p.name for p in sweep_dir.iterdir()] == ["ledger.db"]  # no temp file left behind
