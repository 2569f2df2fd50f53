"""submitit against the real single-node SLURM cluster of tests/slurm/cluster.sh (never mocked).

One job, a throttled array, and a Checkpointable job that is interrupted (simulated timeout),
requeued by SLURM and resumed through its checkpoint(). Skips when no cluster answers.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
from slurm.fixtures import slurm_cluster, wait_done  # noqa: F401  (fixture by import: no conftest needed)
from submitit.helpers import Checkpointable

pytestmark = pytest.mark.slurm

# The jobs unpickle these functions in a fresh interpreter where tests/ is not importable: pickle them
# by value, not by reference to this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _executor(folder: Path, cluster, **params) -> submitit.AutoExecutor:
    # cluster= always explicit: without it submitit picks SLURM whenever srun is on PATH.
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=3)
    ex.update_parameters(timeout_min=2, slurm_partition=cluster.partition, slurm_signal_delay_s=5, cpus_per_task=1)
    if params:
        ex.update_parameters(**params)
    return ex


def _add(a: int, b: int) -> tuple[int, str]:
    return a + b, os.environ.get("SLURM_JOB_ID", "")


def _square(x: int) -> tuple[int, str]:
    return x * x, os.environ.get("SLURM_ARRAY_TASK_ID", "")


class _Resumable(Checkpointable):
    """Counts its attempts in a file; the first waits to be interrupted, the second finishes."""

    def __call__(self, log: str) -> int:
        path = Path(log)
        lines = path.read_text().splitlines() if path.exists() else []
        attempt = sum(ln.startswith("attempt") for ln in lines) + 1
        with path.open("a") as f:
            f.write(f"attempt {attempt}\n")
        if attempt == 1:
            time.sleep(100)  # interrupted long before this ends
            return -1
        return attempt

    def checkpoint(self, log: str):
        with Path(log).open("a") as f:
            f.write("checkpoint\n")
        return super().checkpoint(log)


def test_single_job(tmp_path, slurm_cluster):  # noqa: F811
    job = _executor(tmp_path, slurm_cluster).submit(_add, 2, 3)
    wait_done([job], timeout=60)
    total, job_id = job.result()
    assert total == 5
    assert job_id == job.job_id  # it really ran under SLURM


def test_map_array_throttled(tmp_path, slurm_cluster):  # noqa: F811
    ex = _executor(tmp_path, slurm_cluster, slurm_array_parallelism=2)
    jobs = ex.map_array(_square, [1, 2, 3])
    assert len(jobs) == 3
    assert "--array=0-2%2" in Path(jobs[0].paths.submission_file).read_text()
    wait_done(jobs, timeout=60)
    results = [j.result() for j in jobs]
    assert [r[0] for r in results] == [1, 4, 9]
    assert [r[1] for r in results] == ["0", "1", "2"]


def test_checkpointable_requeued_after_timeout(tmp_path, slurm_cluster):  # noqa: F811
    log = tmp_path / "attempts.log"
    job = _executor(tmp_path, slurm_cluster).submit(_Resumable(), str(log))
    deadline = time.monotonic() + 60
    while not (log.exists() and "attempt 1" in log.read_text()):  # first attempt is running
        assert time.monotonic() < deadline, f"job {job.job_id} never started (state {job.state})"
        assert not job.done(), f"job {job.job_id} ended before it was interrupted: {job.state}"
        time.sleep(0.3)
    job._interrupt(timeout=True)  # the signal SLURM sends before a time limit, at once
    wait_done([job], timeout=75)
    assert job.result() == 2
    assert log.read_text().splitlines() == ["attempt 1", "checkpoint", "attempt 2"]
