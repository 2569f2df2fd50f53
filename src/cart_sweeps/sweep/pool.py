"""Where runs execute: a pool of jobs, each calling `execute` on a run's config in a process of its own.

A pool keeps at most `capacity` jobs in flight and starts the next run as soon as one ends (no batches); a job
that dies without a result is said why (a signal, an out-of-memory kill, scancel, a full disk). The pools live in
sweep/pools/; `launcher._target_` names the one a stage uses (a new launcher: docs/extending.md).
"""

from __future__ import annotations

import difflib
import os
import shutil
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from cart_sweeps import interrupt
from cart_sweeps.config import ConfigError, LauncherConfig
from cart_sweeps.entry import load
from cart_sweeps.record.runfolder import read_summary
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.status import RunStatus
from cart_sweeps.validate import check_bounds

JOBS = ".submitit"  # a stage folder's folder of its pool's job files (submitit's logs, pickles)

Item = TypeVar("Item")
_LOW_DISK_BYTES = 64 * 2**20  # less free space than this beside a dead run: the disk is the likely cause


class Job(Protocol):
    """A started run as a pool hands it out (submitit's jobs are such objects; another launcher wraps its own)."""

    @property
    def job_id(self) -> str: ...

    def done(self) -> bool: ...

    def result(self) -> RunSummary:
        """The run's summary; raises when the job died without one."""
        ...

    def cancel(self, check: bool = True) -> None: ...


@dataclass
class Task:
    """One run inside a job, a plain callable a pool pickles into its job. Called again for the same run (a
    relaunch, a SLURM requeue: pools/slurm.py), it resumes the run from its folder (`execute` finds the newest
    checkpoint)."""

    cfg: DictConfig  # the run's config as its driver composed it (the run composes nothing)
    run_dir: str
    run_id: str  # the id its driver knows it by: the run refuses a config that is not that run

    def __call__(self) -> RunSummary:
        interrupt.install()  # the controller's SIGINT must let the run record `interrupted`
        from cart_sweeps.run import execute  # in the job's process only: the driver needs no torch
        from cart_sweeps.train.output import output_to_run_log

        try:
            with output_to_run_log(self.run_dir):
                return execute(self.cfg, Path(self.run_dir), self.run_id)
        except ConfigError as err:  # a run that cannot succeed as given: recorded, not retried
            return RunSummary(RunStatus.REJECTED, error=str(err))
        except KeyboardInterrupt:  # the run recorded itself interrupted; now die by the signal, so the pool
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # can tell (an interpreter's own exit path may say 1)
            os.kill(os.getpid(), signal.SIGINT)
            raise


def _why(err: Exception) -> str:
    """One line from a submitit error: the last line of the job's traceback, else the error's first line."""
    text = str(err)
    parts = text.split("----------------------\n")
    lines = [line for line in (parts[1] if len(parts) > 2 else text).splitlines() if line.strip()]
    return (lines[-1] if len(parts) > 2 else lines[0]) if lines else repr(err)


def _disk_problem(run_dir: Path, error: str) -> str | None:
    """Why a run died when its disk is the cause (a full disk or a read-only folder fails every retry the same way)."""
    folder = next((p for p in (run_dir, *run_dir.parents) if p.exists()), Path("/"))
    if "Read-only file system" in error or not os.access(folder, os.W_OK):
        return f"{folder} is not writable (read-only): make it writable or choose paths.runs, then relaunch"
    free = shutil.disk_usage(folder).free
    if "No space left on device" in error or free < _LOW_DISK_BYTES:
        return f"disk full at {folder} ({free / 2**20:.0f} MiB free): free some space, then relaunch"
    return None


class Pool(ABC, Generic[Item]):
    """At most `capacity` jobs in flight; `run` feeds it until nothing is left. Built as `cls(cfg, folder)` (the
    run config, its settings typed as `self.launcher`; the folder for its jobs' files), this constructor first."""

    # The pool's settings: their types and bounds, checked before anything launches (`settings_of`). Their
    # values are in conf/launcher/<name>.yaml, which Hydra composes untyped (the root schema cannot know them).
    settings: ClassVar[type[LauncherConfig]]

    def __init__(self, cfg: DictConfig, folder: Path) -> None:
        self.launcher = self.settings_of(cfg.launcher)
        self.capacity, self.poll_s = self.capacity_of(self.launcher), float(self.launcher.poll_s)

    @classmethod
    def settings_of(cls, launcher: DictConfig) -> DictConfig:
        """`launcher` typed by `settings`: a setting it lacks, a value missing or of a wrong type, or one out of
        its bounds is one line naming it (a ConfigError)."""
        schema = cls.settings
        try:
            typed = cast(DictConfig, OmegaConf.merge(OmegaConf.structured(schema), launcher))
        except ConfigKeyError as err:
            known = [f for f in OmegaConf.structured(schema).keys() if f != "_target_"]
            close = difflib.get_close_matches(str(err.key), [str(k) for k in known], n=1)
            advice = f"did you mean launcher.{close[0]}?" if close else f"its settings: {', '.join(map(str, known))}"
            raise ConfigError(f"launcher.{err.key}: {cls.__name__} has no such setting; {advice}") from err
        except OmegaConfBaseException as err:
            why = str(err).splitlines()[0]
            raise ConfigError(
                f"launcher.{err.full_key}: {why}; give it a value of its type ({schema.__name__})"
            ) from err
        if missing := sorted(OmegaConf.missing_keys(typed)):
            raise ConfigError(
                f"launcher.{missing[0]} has no value: set it in conf/launcher/<name>.yaml (the `launcher` group option)"
            )
        check_bounds(typed, "launcher")
        return typed

    @staticmethod
    @abstractmethod
    def capacity_of(launcher: DictConfig) -> int:
        """How many runs the pool keeps in flight with these (typed) launcher settings."""

    @classmethod
    def no_gpu(cls, launcher: DictConfig) -> str | None:
        """Why a run gets no CUDA GPU with these settings (None: it gets one), for preflight's device checks."""
        return None

    @classmethod
    def preflight(cls, launcher: DictConfig, configs: Sequence[DictConfig]) -> None:
        """What these launcher settings need of the stage's distinct run configs beyond their schema, checked
        before anything launches (sweep/preflight.py): a ConfigError line each. None by default."""

    @abstractmethod
    def submit(self, tasks: Sequence[Task]) -> list[Job]:
        """Start `tasks` now (the pool has room for them); one job each. A scheduler that refuses them
        raises ConfigError naming the setting to change."""

    @abstractmethod
    def ending(self, job: Job) -> tuple[RunStatus, str] | None:
        """How a job that left no result ended, when the scheduler or the job's controller knows."""

    def warm(self, runs: int) -> None:
        """Get ready for `runs` runs before the first is handed over, while the driver opens its ledger and sorts
        its runs (a local worker's imports); nothing by default."""

    def release(self, job: Job) -> None:
        """A job ended: its slot is free again."""

    def attach(self, job_id: str) -> Job | None:
        """A job a previous driver left in the queue or running, if it still is (only a cluster's outlive a driver)."""
        return None

    def waiting(self, jobs: Sequence[Job]) -> str | None:
        """Why started jobs are not running yet (a scheduler's pending reasons), for the progress line."""
        return None

    def extra_overrides(self) -> list[str]:
        """Per-run overrides of this pool (how many CPU threads a run may use)."""
        return []

    def outcome(self, job: Job, run_dir: Path) -> RunSummary:
        """The run's summary; for a job that died, its status and one line saying why (no stale metrics)."""
        try:
            return job.result()
        except Exception as err:  # an exception in the run, or a process that died
            recorded = read_summary(run_dir) or RunSummary()
            status, why = self.ending(job) or (RunStatus.FAILED, "")
            error = recorded.error if recorded.status == RunStatus.FAILED else None
            error = error or why or _why(err)
            if disk := _disk_problem(run_dir, error):
                status, error = RunStatus.REJECTED, disk
            return RunSummary(status, run_id=recorded.run_id, label=recorded.label, step=recorded.step, error=error)

    def run(
        self,
        take: Callable[[int], list[Item]],
        task: Callable[[Item], Task],
        on_start: Callable[[Item, str], None],
        on_done: Callable[[Item, RunSummary], None],
        attached: Sequence[tuple[Item, Job]] = (),
        on_refused: Callable[[Item, str], None] = lambda item, error: None,
        on_wait: Callable[[str | None], None] = lambda why: None,
        on_poll: Callable[[Item], bool] = lambda item: False,
    ) -> None:
        """Start what `take(free slots)` gives, report each job as it ends; on any interruption cancel the rest.
        A refused submission ends the launch, each of its runs told (`on_refused`: none is left looking started);
        `on_poll` says whether to stop a running job now (a pruned trial)."""
        active: dict[Job, tuple[Item, Task]] = {job: (item, task(item)) for item, job in attached}
        try:
            while True:
                items = take(self.capacity - len(active))
                tasks = [task(i) for i in items]
                try:
                    jobs = self.submit(tasks) if tasks else []
                except ConfigError as err:
                    for item in items:
                        on_refused(item, str(err))
                    raise
                for item, t, job in zip(items, tasks, jobs, strict=True):
                    active[job] = (item, t)
                    on_start(item, str(job.job_id))
                if not active:
                    return
                self.wait(list(active))
                on_wait(self.waiting(list(active)))
                self.cancel([job for job, (item, _) in active.items() if not job.done() and on_poll(item)])
                for job in [j for j in active if j.done()]:
                    item, t = active.pop(job)
                    self.release(job)
                    on_done(item, self.outcome(job, Path(t.run_dir)))
        finally:
            try:
                self.cancel(list(active))
            finally:
                self.close()

    def wait(self, jobs: Sequence[Job]) -> None:
        """Between two polls: `poll_s` (a pool that can tell cheaply that a job ended returns then, sooner)."""
        time.sleep(self.poll_s)

    def cancel(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            job.cancel(check=False)

    def close(self) -> None:
        """Nothing is left to run, or the launch was interrupted: release what the pool holds besides its jobs."""


def make_pool(cfg: DictConfig, folder: Path) -> Pool[Any]:
    """The pool `launcher._target_` names (conf/launcher/<name>.yaml), built from the run config."""
    return pool_class(cfg.launcher)(cfg, folder)


def capacity(launcher: DictConfig) -> int:
    """How many runs the pool of these launcher settings keeps in flight (plan, bench_stage)."""
    cls = pool_class(launcher)
    return cls.capacity_of(cls.settings_of(launcher))


def pool_class(launcher: DictConfig) -> type[Pool[Any]]:
    cls = load(str(launcher._target_), "launcher._target_")
    if not (isinstance(cls, type) and issubclass(cls, Pool)):
        raise ConfigError(f"launcher._target_={launcher._target_} is not a pool (a subclass of {Pool.__qualname__})")
    return cls
