"""submitit SLURM job arrays (one array per refill), at most `array_parallelism` runs in flight.

A job cut by its time limit or a preemption is requeued by submitit (each Task goes in a Checkpointable,
`Requeued`) and its run resumes from the run folder's newest checkpoint. An sbatch refusal is one line naming
the launcher setting it most likely concerns; a job pending in the queue shows SLURM's reason in the progress line.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit
from omegaconf import MISSING, DictConfig
from submitit.core.utils import FailedJobError

from cart_sweeps.config import ConfigError, LauncherConfig, at_least
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.pool import Item, Job, Pool, Task

_ACTIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING"}
_ENDINGS = {
    "CANCELLED": (RunStatus.CANCELLED, "cancelled on the cluster (scancel)"),
    "OUT_OF_MEMORY": (RunStatus.REJECTED, "out of memory on its node: raise launcher.mem_gb"),
    "TIMEOUT": (RunStatus.CANCELLED, "out of time more often than launcher.max_num_timeout allows: raise it"),
    "PREEMPTED": (RunStatus.CANCELLED, "preempted and not requeued"),
    "DEADLINE": (RunStatus.CANCELLED, "past its deadline"),
    "NODE_FAIL": (RunStatus.FAILED, "its node failed"),
    "BOOT_FAIL": (RunStatus.FAILED, "its node failed to boot"),
}
# Words of sbatch's refusals -> the launcher settings behind them (sbatch names no option itself).
_REFUSALS = {
    "partition": "launcher.partition",
    "qos": "launcher.qos",
    "account": "launcher.account",
    "feature": "launcher.constraint",
    "gres": "launcher.gpus_per_task",
    "memory": "launcher.mem_gb",
    "time limit": "launcher.timeout_min",
    "node configuration": "launcher.gpus_per_task, launcher.cpus_per_task, launcher.mem_gb or launcher.constraint",
}
_PENDING_EVERY_S = 30.0  # squeue at most this often: pending reasons change slowly, the controller is shared


def refusal(stderr: str) -> str:
    """One line from sbatch's refusal, naming the settings it most likely concerns."""
    lines = [line.removeprefix("sbatch: error: ").strip() for line in stderr.splitlines() if line.strip()]
    why = lines[-1] if lines else "no message"
    settings = [s for word, s in _REFUSALS.items() if word in why.lower()]
    fix = f"check {settings[0]}" if settings else "check the launcher.* settings"
    return f"sbatch refused the stage's jobs: {why}; {fix} (nothing was launched from this batch)"


@dataclass
class SlurmLauncherConfig(LauncherConfig):
    """launcher=slurm (conf/launcher/slurm.yaml): sbatch options by name, any other in `additional_parameters`."""

    max_num_timeout: int = field(default=MISSING, metadata=at_least(0))  # requeues after a timeout or preemption
    partition: str | None = MISSING
    qos: str | None = MISSING
    account: str | None = MISSING
    constraint: str | None = MISSING
    gpus_per_task: int = field(default=MISSING, metadata=at_least(0))
    cpus_per_task: int = field(default=MISSING, metadata=at_least(1))
    mem_gb: int = field(default=MISSING, metadata=at_least(1))
    array_parallelism: int = field(default=MISSING, metadata=at_least(1))
    signal_delay_s: int = field(default=MISSING, metadata=at_least(0))
    additional_parameters: dict[str, Any] = MISSING  # any other sbatch option: +launcher.additional_parameters.KEY=V


class Requeued(submitit.helpers.Checkpointable):
    """A run's Task as a SLURM job. Cut by its time limit or a preemption, submitit calls `checkpoint`, which
    requeues this same object; its next call runs the Task again, which resumes the run from its folder."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def __call__(self) -> RunSummary:
        return self.task()


class SlurmPool(Pool[Item]):
    settings = SlurmLauncherConfig

    def __init__(self, cfg: DictConfig, folder: Path) -> None:
        super().__init__(cfg, folder)
        lc = self.launcher
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
        for key in ("partition", "qos", "account", "constraint"):
            if lc[key]:
                params[f"slurm_{key}"] = lc[key]
        self.executor.update_parameters(**params)
        self.folder, self.threads = folder, lc.cpus_per_task
        self._pending_checked = float("-inf")
        self._pending: str | None = None

    @staticmethod
    def capacity_of(launcher: DictConfig) -> int:
        return launcher.array_parallelism

    @classmethod
    def no_gpu(cls, launcher: DictConfig) -> str | None:
        return "launcher.gpus_per_task=0" if launcher.gpus_per_task == 0 else None

    def extra_overrides(self) -> list[str]:
        return [f"trainer.threads={self.threads}"]

    def submit(self, tasks: Sequence[Task]) -> list[Job]:
        stderr = io.StringIO()  # submitit prints sbatch's stderr itself: keep it for the one line below
        try:
            with contextlib.redirect_stderr(stderr), self.executor.batch():
                jobs: list[Job] = [self.executor.submit(Requeued(task)) for task in tasks]
        except FailedJobError as err:
            raise ConfigError(refusal(str(err) or stderr.getvalue())) from err
        return jobs

    def attach(self, job_id: str) -> Job | None:
        job: submitit.SlurmJob[RunSummary] = submitit.SlurmJob(self.folder, job_id)
        return job if job.state in _ACTIVE_STATES else None

    def ending(self, job: Job) -> tuple[RunStatus, str] | None:
        """From the job's final state in SLURM's accounting ("CANCELLED by 0" reads as CANCELLED)."""
        state = getattr(job, "state", None)
        return _ENDINGS.get(state.split()[0]) if state else None

    def waiting(self, jobs: Sequence[Job]) -> str | None:
        """SLURM's reasons for the jobs still pending, e.g. '3 pending (Resources)', from squeue."""
        now = time.monotonic()
        if now - self._pending_checked < _PENDING_EVERY_S:
            return self._pending
        self._pending_checked = now
        ids = ",".join(str(j.job_id) for j in jobs)
        if not ids:
            self._pending = None
            return None
        try:
            out = subprocess.run(
                ["squeue", "--noheader", "--states=PENDING", "--format=%r", f"--jobs={ids}"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return self._pending
        reasons = Counter(line.strip() for line in out.splitlines() if line.strip())
        self._pending = (
            f"{sum(reasons.values())} pending (" + ", ".join(f"{r}" for r, _ in reasons.most_common()) + ")"
            if reasons
            else None
        )
        return self._pending
