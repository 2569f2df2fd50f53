"""submitit processes on this machine: one slot per visible GPU (x runs_per_gpu), or `slots` without GPUs.

A local job is a process group of its own that ends with its driver, however the driver ends
(sweep/local_controller.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import submitit
from omegaconf import DictConfig
from submitit.local.local import LocalJob

from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.local_controller import DRIVER_ENV, GRACE_S, exit_codes_path
from cart_sweeps.sweep.pool import Item, Job, Pool, Task


class LocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor with each job's controller in a session of its own, tied to this driver.

    Mirrors `submitit.local.local.start_controller` (submitit 1.5.4), which has no such option, and runs
    `local_controller` instead of submitit's controller module. `cuda_devices` is the next job's
    CUDA_VISIBLE_DEVICES as given (an index, a GPU UUID or a MIG id: submitit's own parameter takes ints only).
    """

    cuda_devices = ""

    def _submit_command(self, command: str) -> LocalJob:
        p = self.parameters
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
            "CUDA_VISIBLE_DEVICES": self.cuda_devices,
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


def visible_gpus() -> list[str]:
    """The GPUs this driver may hand out: CUDA_VISIBLE_DEVICES as given (indices, GPU UUIDs, MIG ids)
    when set, else every device torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    import torch

    return [str(k) for k in range(torch.cuda.device_count())]


class LocalPool(Pool[Item]):
    """Processes on this machine: one slot per visible GPU (x runs_per_gpu), or `slots` on a CPU machine."""

    def __init__(self, cfg: DictConfig, folder: Path) -> None:
        lc = cfg.launcher
        gpus = visible_gpus()
        self.free: list[str | None] = [g for g in gpus for _ in range(lc.runs_per_gpu)] if gpus else [None] * lc.slots
        super().__init__(len(self.free), lc.poll_s)
        self.threads = max(1, len(os.sched_getaffinity(0)) // self.capacity)
        self.executor = LocalExecutor(folder, max_num_timeout=lc.max_num_timeout)
        self.executor.update_parameters(timeout_min=lc.timeout_min, setup=list(lc.setup))
        self.folder = folder
        self.slot_of: dict[str, str | None] = {}

    @staticmethod
    def capacity_of(launcher: DictConfig) -> int:
        gpus = visible_gpus()
        return len(gpus) * launcher.runs_per_gpu if gpus else launcher.slots

    @staticmethod
    def local_gpus() -> list[str]:
        return visible_gpus()

    def extra_overrides(self) -> list[str]:
        return [f"trainer.threads={self.threads}"]

    def submit(self, tasks: Sequence[Task]) -> list[Job]:
        jobs: list[Job] = []
        for task in tasks:
            gpu = self.free.pop(0)
            self.executor.cuda_devices = gpu or ""
            task.env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
            job = self.executor.submit(task)
            self.slot_of[job.job_id] = gpu
            jobs.append(job)
        return jobs

    def release(self, job: Job) -> None:
        self.free.append(self.slot_of.pop(job.job_id))

    def ending(self, job: Job) -> tuple[RunStatus, str] | None:
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

    def cancel(self, jobs: Sequence[Job]) -> None:
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
