"""Where runs execute: submitit jobs on local slots or SLURM arrays, each calling run_job in-process.

A pool keeps at most `capacity` jobs in flight and starts the next run as soon as one ends (no
batches). A local job is a process group of its own that ends with its driver, however the driver ends
(local_controller). A SLURM job cut by its time limit or a preemption is requeued by submitit
(Checkpointable) and its run resumes from the run folder's newest checkpoint. When a job dies without a
result, the pool says why (a signal, an out-of-memory kill, scancel, a full disk) and whether a retry can help.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import submitit
from omegaconf import DictConfig
from submitit.local.local import LocalJob

from cart_sweeps.config import ConfigError
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.local_controller import DRIVER_ENV, GRACE_S, exit_codes_path
from cart_sweeps.train.runfolder import read_summary

Item = TypeVar("Item")
_ACTIVE_SLURM_STATES = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING"}
_LOW_DISK_BYTES = 64 * 2**20  # less free space than this beside a dead run: the disk is the likely cause


@dataclass
class Task(submitit.helpers.Checkpointable):
    """One run inside a submitit job. On requeue submitit pickles it again as it is, and the next
    call resumes the run from its folder (run_job finds the newest checkpoint)."""

    overrides: list[str]
    run_dir: str
    env: dict[str, str]

    def __call__(self) -> dict[str, Any]:
        os.environ.update(self.env)
        from cart_sweeps.train.run import run_job  # in the job's process only: the driver needs no torch

        try:
            return run_job(self.overrides, self.run_dir)
        except ConfigError as err:  # a run that cannot succeed as given: recorded, not retried
            return {"status": RunStatus.REJECTED, "error": str(err)}


def _why(err: Exception) -> str:
    """One line from a submitit error: the last line of the job's traceback, else the error's first line."""
    text = str(err)
    parts = text.split("----------------------\n")
    lines = [line for line in (parts[1] if len(parts) > 2 else text).splitlines() if line.strip()]
    return (lines[-1] if len(parts) > 2 else lines[0]) if lines else repr(err)


def _disk_full(run_dir: Path, error: str) -> str | None:
    """Why a run died when its disk is the cause (a full disk fails every retry the same way)."""
    folder = next((p for p in (run_dir, *run_dir.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(folder).free
    if "No space left on device" in error or free < _LOW_DISK_BYTES:
        return f"disk full at {folder} ({free / 2**20:.0f} MiB free): free some space, then relaunch"
    return None


class Pool(ABC, Generic[Item]):
    """At most `capacity` submitit jobs in flight; `run` feeds it until nothing is left."""

    def __init__(self, capacity: int, poll_s: float) -> None:
        self.capacity, self.poll_s = capacity, poll_s

    @abstractmethod
    def submit(self, tasks: Sequence[Task]) -> list[submitit.Job]:
        """Start `tasks` now (the pool has room for them); one job each."""

    @abstractmethod
    def ending(self, job: submitit.Job) -> tuple[RunStatus, str] | None:
        """How a job that left no result ended, when the scheduler or the job's controller knows."""

    def release(self, job: submitit.Job) -> None:
        """A job ended: its slot is free again."""

    def attach(self, job_id: str) -> submitit.Job | None:
        """A job a previous driver left in the queue or running, if it still is (only SLURM outlives a driver)."""
        return None

    def extra_overrides(self) -> list[str]:
        """Per-run overrides of this pool (how many CPU threads a run may use)."""
        return []

    def outcome(self, job: submitit.Job, run_dir: Path) -> dict[str, Any]:
        """The run's summary; for a job that died, its status and one line saying why (no stale metrics)."""
        try:
            return job.result()
        except Exception as err:  # an exception in run_job, or a process that died
            recorded = read_summary(run_dir) or {}
            status, why = self.ending(job) or (RunStatus.FAILED, "")
            error = recorded.get("error") if recorded.get("status") == RunStatus.FAILED else None
            error = error or why or _why(err)
            if disk := _disk_full(run_dir, error):
                status, error = RunStatus.REJECTED, disk
            return {"status": status, "error": error, "step": recorded.get("step")}

    def run(
        self,
        take: Callable[[int], list[Item]],
        task: Callable[[Item], Task],
        on_start: Callable[[Item, str], None],
        on_done: Callable[[Item, dict[str, Any]], None],
        attached: Sequence[tuple[Item, submitit.Job]] = (),
        on_poll: Callable[[Item], bool] = lambda item: False,
    ) -> None:
        """Start what `take(free slots)` gives, report each job as it ends; on any interruption cancel the rest.

        Each poll asks `on_poll` of every running job whether to stop it now (a pruned trial); it then ends as any job.
        """
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
                self.cancel([job for job, (item, _) in active.items() if not job.done() and on_poll(item)])
                for job in [j for j in active if j.done()]:
                    item, t = active.pop(job)
                    self.release(job)
                    on_done(item, self.outcome(job, Path(t.run_dir)))
        finally:
            self.cancel(list(active))

    def cancel(self, jobs: Sequence[submitit.Job]) -> None:
        for job in jobs:
            job.cancel(check=False)


class LocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor with each job's controller in a session of its own, tied to this driver.

    Mirrors `submitit.local.local.start_controller` (submitit 1.5.4), which has no such option, and runs
    `local_controller` instead of submitit's controller module.
    """

    def _submit_command(self, command: str) -> LocalJob:
        p = self.parameters
        n_gpus, visible = p.get("gpus_per_node", 0), p.get("visible_gpus", ())
        gpus = range(n_gpus) if visible == () else visible[:n_gpus]
        ntasks = p.get("tasks_per_node", 1)
        env = {
            **os.environ,
            "SUBMITIT_LOCAL_NTASKS": str(ntasks),
            "SUBMITIT_LOCAL_COMMAND": command,
            "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * p.get("timeout_min", 2.0))),
            "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(p.get("signal_delay_s", 30))),
            "SUBMITIT_LOCAL_NODEID": "0",
            "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
            "SUBMITIT_STDERR_TO_STDOUT": "1" if p.get("stderr_to_stdout") else "",
            "SUBMITIT_EXECUTOR": "local",
            "SUBMITIT_LOCAL_WITH_SHELL": "",  # `exec` below keeps the job id the controller's own pid
            "CUDA_VISIBLE_DEVICES": ",".join(str(k) for k in gpus),
            DRIVER_ENV: str(os.getpid()),
        }
        controller = [sys.executable, "-m", "cart_sweeps.sweep.local_controller", str(self.folder)]
        setup = list(p.get("setup", ()))
        args: Any = " && ".join([*setup, "exec " + shlex.join(controller)]) if setup else controller
        process = subprocess.Popen(args, shell=bool(setup), env=env, start_new_session=True)
        return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks)))


_SIGNAL_ENDINGS = {
    signal.SIGKILL: (RunStatus.CANCELLED, "killed by SIGKILL (the out-of-memory killer, or kill -9)"),
    signal.SIGINT: (RunStatus.CANCELLED, "interrupted by SIGINT from outside the driver"),
    signal.SIGTERM: (RunStatus.CANCELLED, "terminated by SIGTERM from outside the driver"),
}


class LocalPool(Pool[Item]):
    """Processes on this machine: one slot per visible GPU (x runs_per_gpu), or `slots` on a CPU machine."""

    def __init__(self, cfg: DictConfig, folder: Path, gpus: Sequence[int]) -> None:
        lc = cfg.launcher
        self.free: list[int | None] = [g for g in gpus for _ in range(lc.runs_per_gpu)] if gpus else [None] * lc.slots
        super().__init__(len(self.free), lc.poll_s)
        self.threads = max(1, len(os.sched_getaffinity(0)) // self.capacity)
        self.executor = LocalExecutor(folder, max_num_timeout=lc.max_num_timeout)
        self.executor.update_parameters(timeout_min=lc.timeout_min, setup=list(lc.setup))
        self.folder = folder
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
            job = self.executor.submit(task)
            self.slot_of[job.job_id] = gpu
            jobs.append(job)
        return jobs

    def release(self, job: submitit.Job) -> None:
        self.free.append(self.slot_of.pop(job.job_id))

    def ending(self, job: submitit.Job) -> tuple[RunStatus, str] | None:
        """From the exit code its controller recorded; none recorded means the controller itself was killed."""
        path = exit_codes_path(self.folder, job.job_id)
        if not path.exists():
            return RunStatus.CANCELLED, f"its controller (pid {job.job_id}) was killed from outside the driver"
        codes = json.loads(path.read_text())
        code = codes[0] if codes else None
        if code is None or code >= 0:
            return None  # it exited: its own error (result pickle, error.log) says why
        sig = signal.Signals(-code)
        return _SIGNAL_ENDINGS.get(sig, (RunStatus.FAILED, f"crashed with {sig.name}"))

    def cancel(self, jobs: Sequence[submitit.Job]) -> None:
        """Ask each job's controller to stop (its tasks get SIGINT and record their runs as interrupted),
        wait for them, then kill whatever is left of each job's process group."""
        for job in jobs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(job.job_id), signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S + 5
        while any(not j.done() for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for job in jobs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(job.job_id), signal.SIGKILL)


_SLURM_ENDINGS = {
    "CANCELLED": (RunStatus.CANCELLED, "cancelled on the cluster (scancel)"),
    "OUT_OF_MEMORY": (RunStatus.REJECTED, "out of memory on its node: raise launcher.mem_gb"),
    "TIMEOUT": (RunStatus.CANCELLED, "out of time more often than launcher.max_num_timeout allows: raise it"),
    "PREEMPTED": (RunStatus.CANCELLED, "preempted and not requeued"),
    "DEADLINE": (RunStatus.CANCELLED, "past its deadline"),
    "NODE_FAIL": (RunStatus.FAILED, "its node failed"),
    "BOOT_FAIL": (RunStatus.FAILED, "its node failed to boot"),
}


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

    def ending(self, job: submitit.Job) -> tuple[RunStatus, str] | None:
        """From the job's final state in SLURM's accounting ("CANCELLED by 0" reads as CANCELLED)."""
        return _SLURM_ENDINGS.get(job.state.split()[0]) if job.state else None


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
