"""Where runs execute: submitit jobs on local slots or SLURM arrays, each calling run_job in-process.

A pool keeps at most `capacity` jobs in flight and starts the next run as soon as one ends (no
batches). Stopping the driver (Ctrl-C, SIGTERM) cancels its jobs; a local job whose driver is killed
outright ends itself. A SLURM job cut by its time limit or a preemption is requeued by submitit
(Checkpointable) and its run resumes from the run folder's newest checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import submitit
from omegaconf import DictConfig

from cart_sweeps.config import ConfigError
from cart_sweeps.train.runfolder import read_summary

Item = TypeVar("Item")
_ACTIVE_SLURM_STATES = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING"}


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return not Path("/proc/self").exists() and _signalable(pid)


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _end_with(pid: int) -> None:
    """End this job (and its submitit controller) once process `pid`, the driver, is gone."""
    while _alive(pid):
        time.sleep(1.0)
    os.kill(os.getppid(), signal.SIGKILL)
    os._exit(1)


@dataclass
class Task(submitit.helpers.Checkpointable):
    """One run inside a submitit job. On requeue submitit pickles it again as it is, and the next
    call resumes the run from its folder (run_job finds the newest checkpoint)."""

    overrides: list[str]
    run_dir: str
    env: dict[str, str]
    driver_pid: int | None = None  # local jobs: end when this driver dies

    def __call__(self) -> dict[str, Any]:
        os.environ.update(self.env)
        if self.driver_pid is not None:
            threading.Thread(target=_end_with, args=(self.driver_pid,), daemon=True).start()
        from cart_sweeps.train.run import run_job  # in the job's process only: the driver needs no torch

        return run_job(self.overrides, self.run_dir)


def outcome(job: submitit.Job, run_dir: Path) -> dict[str, Any]:
    """The run's summary, or a failed one saying why the job died (with what its run folder recorded)."""
    try:
        return job.result()
    except Exception as err:  # an exception in run_job or a killed process: the run failed
        summary = read_summary(run_dir) or {}
        return {**summary, "status": "failed", "error": summary.get("error") or _why(err)}


def _why(err: Exception) -> str:
    """One line from a submitit error: the last line of the job's traceback, else the error's first line."""
    text = str(err)
    parts = text.split("----------------------\n")
    lines = [line for line in (parts[1] if len(parts) > 2 else text).splitlines() if line.strip()]
    return (lines[-1] if len(parts) > 2 else lines[0]) if lines else repr(err)


class Pool(ABC, Generic[Item]):
    """At most `capacity` submitit jobs in flight; `run` feeds it until nothing is left."""

    def __init__(self, capacity: int, poll_s: float) -> None:
        self.capacity, self.poll_s = capacity, poll_s

    @abstractmethod
    def submit(self, tasks: Sequence[Task]) -> list[submitit.Job]:
        """Start `tasks` now (the pool has room for them); one job each."""

    def release(self, job: submitit.Job) -> None:
        """A job ended: its slot is free again."""

    def attach(self, job_id: str) -> submitit.Job | None:
        """A job a previous driver left in the queue or running, if it still is (only SLURM outlives a driver)."""
        return None

    def extra_overrides(self) -> list[str]:
        """Per-run overrides of this pool (how many CPU threads a run may use)."""
        return []

    def run(
        self,
        take: Callable[[int], list[Item]],
        task: Callable[[Item], Task],
        on_start: Callable[[Item, str], None],
        on_done: Callable[[Item, dict[str, Any]], None],
        attached: Sequence[tuple[Item, submitit.Job]] = (),
    ) -> None:
        """Start what `take(free slots)` gives, report each job as it ends; on any interruption cancel the rest."""
        active: dict[submitit.Job, tuple[Item, Task]] = {job: (item, task(item)) for item, job in attached}
        try:
            while True:
                items = take(self.capacity - len(active))
                tasks = [task(i) for i in items]
                for item, t, job in zip(items, tasks, self.submit(tasks) if tasks else [], strict=True):
                    active[job] = (item, t)
                    on_start(item, str(job.job_id))
                if not active:
                    return
                time.sleep(self.poll_s)
                for job in [j for j in active if j.done()]:
                    item, t = active.pop(job)
                    self.release(job)
                    on_done(item, outcome(job, Path(t.run_dir)))
        finally:
            self.cancel(list(active))

    def cancel(self, jobs: Sequence[submitit.Job]) -> None:
        for job in jobs:
            job.cancel(check=False)


class LocalPool(Pool[Item]):
    """Processes on this machine: one slot per visible GPU (x runs_per_gpu), or `slots` on a CPU machine."""

    def __init__(self, cfg: DictConfig, folder: Path, gpus: Sequence[int]) -> None:
        lc = cfg.launcher
        self.free: list[int | None] = [g for g in gpus for _ in range(lc.runs_per_gpu)] if gpus else [None] * lc.slots
        super().__init__(len(self.free), lc.poll_s)
        self.threads = max(1, len(os.sched_getaffinity(0)) // self.capacity)
        self.executor = submitit.LocalExecutor(folder, max_num_timeout=lc.max_num_timeout)
        self.executor.update_parameters(timeout_min=lc.timeout_min, setup=list(lc.setup))
        self.slot_of: dict[str, int | None] = {}

    def extra_overrides(self) -> list[str]:
        return [f"trainer.threads={self.threads}"]

    def submit(self, tasks: Sequence[Task]) -> list[submitit.Job]:
        jobs = []
        for task in tasks:
            gpu = self.free.pop(0)
            self.executor.update_parameters(
                gpus_per_node=0 if gpu is None else 1, visible_gpus=() if gpu is None else (gpu,)
            )
            task.env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
            task.driver_pid = os.getpid()
            job = self.executor.submit(task)
            self.slot_of[job.job_id] = gpu
            jobs.append(job)
        return jobs

    def release(self, job: submitit.Job) -> None:
        self.free.append(self.slot_of.pop(job.job_id))

    def cancel(self, jobs: Sequence[submitit.Job]) -> None:
        """SIGINT to each job's task (the trainer records the run as interrupted), then wait until every
        process is gone. A controller whose task has not started yet is simply killed. Signalling the
        task rather than its submitit controller keeps the driver's terminal free of tracebacks."""
        for job in jobs:
            pid = int(job.job_id)
            try:
                tasks = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                tasks = []
            for target, sig in [(int(t), signal.SIGINT) for t in tasks] or [(pid, signal.SIGKILL)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, sig)
        deadline = time.monotonic() + 30
        while any(not j.done() for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.1)
        for job in jobs:
            if not job.done():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(job.job_id), signal.SIGKILL)


class SlurmPool(Pool[Item]):
    """SLURM job arrays (one array per refill), at most `array_parallelism` runs in flight."""

    def __init__(self, cfg: DictConfig, folder: Path) -> None:
        lc = cfg.launcher
        super().__init__(lc.array_parallelism, max(lc.poll_s, 5.0))
        self.executor = submitit.AutoExecutor(folder, cluster="slurm", slurm_max_num_timeout=lc.max_num_timeout)
        params: dict[str, Any] = {
            "name": f"cart-{cfg.stage.name}",
            "timeout_min": lc.timeout_min,
            "cpus_per_task": lc.cpus_per_task,
            "mem_gb": lc.mem_gb,
            "slurm_array_parallelism": lc.array_parallelism,
            "slurm_signal_delay_s": lc.signal_delay_s,
            "slurm_setup": list(lc.setup),
            "slurm_additional_parameters": dict(lc.additional_parameters),
        }
        if lc.gpus_per_task:
            params["gpus_per_node"] = lc.gpus_per_task
        if lc.partition:
            params["slurm_partition"] = lc.partition
        self.executor.update_parameters(**params)
        self.folder, self.threads = folder, lc.cpus_per_task

    def extra_overrides(self) -> list[str]:
        return [f"trainer.threads={self.threads}"]

    def submit(self, tasks: Sequence[Task]) -> list[submitit.Job]:
        with self.executor.batch():
            jobs = [self.executor.submit(task) for task in tasks]
        return jobs

    def attach(self, job_id: str) -> submitit.Job | None:
        job = submitit.SlurmJob(self.folder, job_id)
        return job if job.state in _ACTIVE_SLURM_STATES else None


def make_pool(cfg: DictConfig, folder: Path) -> Pool[Any]:
    """The pool `launcher.name` asks for."""
    if cfg.launcher.name == "slurm":
        return SlurmPool(cfg, folder)
    if cfg.launcher.name == "local":
        return LocalPool(cfg, folder, visible_gpus())
    raise ConfigError(f"launcher.name={cfg.launcher.name!r} is not allowed; use launcher=local or launcher=slurm")


def visible_gpus() -> list[int]:
    """The GPUs this driver may hand out: CUDA_VISIBLE_DEVICES when set, else every device torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [int(g) for g in env.split(",") if g.strip()]
    import torch

    return list(range(torch.cuda.device_count()))
