"""Runs on this machine: one slot per visible GPU (x runs_per_gpu), or `slots` without GPUs.

Each slot keeps a warm worker, a submitit job that forks a process per run (sweep/pools/worker.py). A
worker is a process group of its own that ends with its driver, however the driver ends
(sweep/local_controller.py), and takes its runs with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import MISSING, DictConfig
from submitit import LocalJob

from cart_sweeps.adapters.submitit import SessionExecutor
from cart_sweeps.config import ConfigError, LauncherConfig, at_least
from cart_sweeps.hardware import gpu_memory_bytes, nvidia_gpus
from cart_sweeps.options import StageKind
from cart_sweeps.record.runfolder import RUNS_AT_ONCE, atomic_write
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.cost import GIB, memory_need_bytes
from cart_sweeps.sweep.local_controller import DRIVER_ENV, GRACE_S, exit_codes_path
from cart_sweeps.sweep.pool import Item, Job, Pool, Task
from cart_sweeps.sweep.pools.worker import POLL_S, Worker, mail


@dataclass
class LocalLauncherConfig(LauncherConfig):
    """launcher=local (conf/launcher/local.yaml): one slot per visible GPU (x runs_per_gpu), or `slots` without."""

    slots: int = field(default=MISSING, metadata=at_least(1))
    runs_per_gpu: int = field(default=MISSING, metadata=at_least(1))


class LocalExecutor(SessionExecutor):
    """submitit's LocalExecutor with each job's controller (sweep/local_controller.py) in a session of its own, tied
    to this driver."""

    def controller(self) -> tuple[list[str], dict[str, str]]:
        command = [sys.executable, "-m", "cart_sweeps.sweep.local_controller", str(self.folder)]
        return command, {DRIVER_ENV: str(os.getpid())}


_SIGNAL_ENDINGS = {
    signal.SIGKILL: (RunStatus.CANCELLED, "killed by SIGKILL (the out-of-memory killer, or kill -9)"),
    signal.SIGINT: (RunStatus.CANCELLED, "interrupted by SIGINT from outside the driver"),
    signal.SIGTERM: (RunStatus.CANCELLED, "terminated by SIGTERM from outside the driver"),
}


def visible_gpus() -> list[str]:
    """The GPUs this driver may hand out: CUDA_VISIBLE_DEVICES as given (indices, GPU UUIDs, MIG ids)
    when set, else every device nvidia-smi lists (a GPU's index, or its MIG devices' UUIDs)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    return [gpu.id for gpu in nvidia_gpus()]


@dataclass(eq=False)
class WarmWorker:
    """A slot's worker job and its mailbox (sweep/pools/worker.py)."""

    job: LocalJob
    mailbox: Path
    given: int = 0  # runs handed to it so far: the next one's number in the mailbox

    def gone(self) -> bool:
        """Its controller has ended and so has every process of its group (a worker orphaned by a killed
        controller included): only then may another worker take its slot."""
        return self.job.done() and not _group_alive(int(self.job.job_id))


@dataclass
class Slot:
    """A GPU (or a CPU share) and the worker that runs on it, started when first needed."""

    gpu: str | None
    worker: WarmWorker | None = None


@dataclass(eq=False)
class ForkedRun:
    """A run handed to a worker: the Job the driver sees (done, result, cancel through the mailbox)."""

    worker: WarmWorker
    n: int

    @property
    def job_id(self) -> str:
        return f"{self.worker.job.job_id}.{self.n}"

    def mail(self, kind: str) -> Path:
        return mail(self.worker.mailbox, self.n, kind)

    def done(self) -> bool:
        return self.mail("exit").exists() or self.worker.gone()

    def result(self) -> RunSummary:
        try:
            kind, value = pickle.loads(self.mail("result").read_bytes())
        except FileNotFoundError:
            raise RuntimeError(f"run {self.job_id} ended without a result") from None
        if kind != "success":
            raise RuntimeError(value)
        return cast(RunSummary, value)

    def cancel(self, check: bool = True) -> None:
        self.mail("cancel").touch()

    def exit_record(self) -> dict[str, Any] | None:
        try:
            return cast(dict[str, Any], json.loads(self.mail("exit").read_text()))
        except FileNotFoundError:
            return None


class LocalPool(Pool[Item]):
    """Warm workers on this machine (sweep/pools/worker.py): one per visible GPU (x runs_per_gpu), or
    `slots` on a CPU machine; each run a process forked by its slot's worker."""

    settings = LocalLauncherConfig

    def __init__(self, cfg: DictConfig, folder: Path) -> None:
        super().__init__(cfg, folder)
        lc = self.launcher
        gpus = visible_gpus()
        shares: list[str | None] = [g for g in gpus for _ in range(lc.runs_per_gpu)] if gpus else [None] * lc.slots
        self.slots = [Slot(share) for share in shares]  # one per unit of capacity_of
        self.free = list(self.slots)
        threads = str(max(1, len(os.sched_getaffinity(0)) // self.capacity))
        self.threads, self.worker_env = threads, {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        self.worker_env[RUNS_AT_ONCE] = str(lc.runs_per_gpu if gpus else lc.slots)
        self.run_timeout_s = 60.0 * lc.timeout_min
        self.modules = preloads(cfg)
        self.executor = LocalExecutor(folder)
        self.executor.update_parameters(timeout_min=_WORKER_LIFETIME_MIN, setup=list(lc.setup))
        self.folder = folder
        self.slot_of: dict[ForkedRun, Slot] = {}
        self.workers: list[WarmWorker] = []  # every worker started, so that none outlives the driver

    @staticmethod
    def capacity_of(launcher: DictConfig) -> int:
        gpus = visible_gpus()
        return len(gpus) * launcher.runs_per_gpu if gpus else launcher.slots

    @classmethod
    def no_gpu(cls, launcher: DictConfig) -> str | None:
        return None if visible_gpus() else "this machine has none visible"

    @classmethod
    def preflight(cls, launcher: DictConfig, configs: Sequence[DictConfig]) -> None:
        """Runs packed onto a GPU: the largest run's estimated need against the smallest GPU's memory."""
        if (gpus := visible_gpus()) and launcher.runs_per_gpu > 1:
            memory = [m for m in gpu_memory_bytes(gpus) if m is not None]
            need = max(memory_need_bytes(c) for c in configs)
            check_packing(launcher.runs_per_gpu, need, min(memory, default=None))

    def extra_overrides(self) -> list[str]:
        return [f"trainer.threads={self.threads}"]

    def warm(self, runs: int) -> None:
        """Start the workers of the first `runs` slots now: a worker's start (its controller, then torch's imports,
        about 5 s on 2 CPU cores) overlaps the driver's, rather than following it."""
        for slot in self.free[:runs]:
            if slot.worker is None:
                slot.worker = self._start_worker(slot.gpu)
                self.workers.append(slot.worker)

    def submit(self, tasks: Sequence[Task]) -> list[Job]:
        jobs: list[Job] = []
        for task in tasks:
            slot = self.free.pop(0)
            if slot.worker is None or slot.worker.job.done():
                if slot.worker is not None:
                    _end(slot.worker)
                slot.worker = self._start_worker(slot.gpu)
                self.workers.append(slot.worker)
            run = ForkedRun(slot.worker, slot.worker.given)
            slot.worker.given += 1
            _hand_over(task, run.mail("task"))
            self.slot_of[run] = slot
            jobs.append(run)
        return jobs

    def _start_worker(self, gpu: str | None) -> WarmWorker:
        self.folder.mkdir(parents=True, exist_ok=True)
        mailbox = Path(tempfile.mkdtemp(prefix="worker-", dir=self.folder))
        self.executor.cuda_devices = gpu or ""
        job = self.executor.submit(Worker(str(mailbox), self.worker_env, self.run_timeout_s, self.modules))
        return WarmWorker(cast(LocalJob, job), mailbox)

    def release(self, job: Job) -> None:
        self.free.append(self.slot_of.pop(cast(ForkedRun, job)))

    def ending(self, job: Job) -> tuple[RunStatus, str] | None:
        """From the exit code its worker recorded; none recorded means the worker itself ended."""
        run = cast(ForkedRun, job)
        record = run.exit_record()
        if record is None:
            return _worker_ending(run.worker.job, self.folder)
        if record.get("orphaned"):
            return RunStatus.CANCELLED, (
                f"its worker's controller (pid {run.worker.job.job_id}) was killed from outside the driver; "
                "the run was stopped as on Ctrl-C (a relaunch resumes it)"
            )
        if record["timed_out"]:
            limit = f"launcher.timeout_min={self.run_timeout_s / 60:g}"
            return RunStatus.CANCELLED, f"ran longer than {limit}: raise it (a relaunch resumes the run)"
        return _code_ending(record["code"])

    def wait(self, jobs: Sequence[Job]) -> None:
        """Until the next poll, or the moment a run ends: its slot takes the next run at once."""
        deadline = time.monotonic() + self.poll_s
        while time.monotonic() < deadline and not any(job.done() for job in jobs):
            time.sleep(POLL_S)

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Ask each run's worker to stop it (SIGINT: the run records itself interrupted; SIGKILL after a
        grace period) and wait; a worker that does not answer is stopped with its runs."""
        for job in jobs:
            job.cancel(check=False)
        _wait_until(lambda: all(job.done() for job in jobs))
        _stop_workers([cast(ForkedRun, job).worker.job for job in jobs if not job.done()])

    def close(self) -> None:
        """End every worker started: no run is left in them (`cancel` has stopped those still going)."""
        for worker in self.workers:
            _kill_group(worker.job)


def preloads(cfg: DictConfig) -> tuple[str, ...]:
    """What a stage's runs import besides the project, for its workers to import once before their first run:
    torch.optim's first step imports torch._dynamo (1.4-2.5 s of a cold run; an evaluation never imports it,
    so an evaluate stage's workers start that much sooner), and lm-eval where runs benchmark (0.6-0.9 s)."""
    if StageKind.of(cfg).trains:
        return ("torch._dynamo",)
    return ("cart_sweeps.harness.bench",) if cfg.harness.tasks else ()


def check_packing(runs_per_gpu: int, need: int, gpu_memory: int | None) -> None:
    """Runs packed onto one GPU (launcher.runs_per_gpu) must fit its memory by their estimated need."""
    if runs_per_gpu > 1 and gpu_memory is not None and runs_per_gpu * need > gpu_memory:
        raise ConfigError(
            f"launcher.runs_per_gpu={runs_per_gpu} packs runs that need up to {need / GIB:.1f} GiB each (estimated) "
            f"onto GPUs of {gpu_memory / GIB:.0f} GiB; lower launcher.runs_per_gpu"
        )


_WORKER_LIFETIME_MIN = 60 * 24 * 365  # the controller's limit on its worker; each run has launcher.timeout_min


def _hand_over(task: Task, path: Path) -> None:
    """The worker takes a task whole or not at all: it is renamed into place."""
    atomic_write(path, lambda tmp: tmp.write_bytes(pickle.dumps(task)))


def _code_ending(code: int | None) -> tuple[RunStatus, str] | None:
    """How a process with this exit code ended, when a signal ended it (an exit says why by itself)."""
    if code is None or code >= 0:
        return None
    sig = signal.Signals(-code)
    return _SIGNAL_ENDINGS.get(sig, (RunStatus.FAILED, f"crashed with {sig.name}"))


def _worker_ending(worker: LocalJob, folder: Path) -> tuple[RunStatus, str]:
    """Why a run's worker ended under it, from the exit code its controller recorded."""
    path = exit_codes_path(folder, worker.job_id)
    if not path.exists():
        return RunStatus.CANCELLED, f"its worker's controller (pid {worker.job_id}) was killed from outside the driver"
    codes = json.loads(path.read_text())
    code = codes[0] if codes else None
    if ending := _code_ending(code):
        return ending[0], f"its worker was {ending[1]}"
    return RunStatus.FAILED, f"its worker ended (exit code {code}); its log: {worker.paths.stderr}"


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies, which no one may have reaped, do not count)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue
        if int(group) == pgid and state != "Z":
            return True
    return False


def _end(worker: WarmWorker) -> None:
    """Wait for a worker whose controller ended to be gone (an orphan stops its run within the grace
    period), then end whatever is left of its group: never two workers on one slot."""
    _wait_until(worker.gone)
    _kill_group(worker.job)


def _wait_until(done: Callable[[], bool]) -> None:
    """Until `done()`, at most the grace period and 5 s more."""
    deadline = time.monotonic() + GRACE_S + 5
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def _stop_workers(workers: Sequence[LocalJob]) -> None:
    """SIGTERM to each worker's controller (its runs get SIGINT and record themselves interrupted), a
    wait, then SIGKILL to whatever is left of each job's process group."""
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(worker.job_id), signal.SIGTERM)
    _wait_until(lambda: all(worker.done() for worker in workers))
    for worker in workers:
        _kill_group(worker)


def _kill_group(worker: LocalJob) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(int(worker.job_id), signal.SIGKILL)
