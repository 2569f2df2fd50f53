"""Hydra's plain launcher API (a list of override lists, e.g. from the basic sweeper) on our pools."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from pathlib import Path

from cart_sweeps.compose import quote_stage
from cart_sweeps.composer import Composer
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.sweep.driver import PoolFactory
from cart_sweeps.sweep.expand import Run, make_configuration, make_run
from cart_sweeps.sweep.pool import JOBS, Task


def run_batch(job_overrides: Sequence[Sequence[str]], make_pool: PoolFactory) -> list[tuple[Run, RunSummary]]:
    """Validate every job first, run them all (a slot at a time), return each run with its summary, in order."""
    compose = Composer()
    runs = [make_run({}, quote_stage(o), make_configuration(compose(quote_stage(o)))) for o in job_overrides]
    if not runs:
        return []
    first = runs[0].config.cfg
    pool = make_pool(first, Path(first.paths.runs) / first.stage.name / JOBS)
    results: dict[int, RunSummary]
    pending, results = deque(range(len(runs))), {}

    def take(n: int) -> list[int]:
        return [pending.popleft() for _ in range(min(n, len(pending)))]

    def task(i: int) -> Task:
        return Task(compose(runs[i].overrides + pool.extra_overrides()), str(runs[i].run_dir), runs[i].run_id)

    pool.run(take, task, lambda i, job_id: None, results.__setitem__)
    return [(run, results[i]) for i, run in enumerate(runs)]
