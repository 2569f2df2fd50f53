"""A warm worker: one long-lived job per slot that imports torch and the project once, then forks a fresh
process for each run.

A cold run spent ~2.6 s before its first step (a controller and a task process starting, then torch,
Hydra and the project imported); a forked run starts from a process that has done all of that, and is
still a process of its own: a crash, a leak or a CUDA error ends with it. The worker touches neither
CUDA nor a torch op (a forked child can then use both), so a forked run starts from the state a cold
one would and computes the same numbers.

The driver and a worker talk through files in the worker's mailbox folder, readable after the fact:

    <n>.task     the worker's n-th run (a pickled Task), renamed into place by the driver
    <n>.cancel   the driver asks for run n to stop: SIGINT (the run records itself interrupted), then
                 SIGKILL after GRACE_S
    <n>.result   ("success", RunSummary) or ("error", one line), written by the run's process
    <n>.exit     {"pid": the run's process, "code": its exit code (negative: the signal), "timed_out": ...,
                 "orphaned": stopped because the worker lost its controller}, written by the worker
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass
from itertools import count
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from cart_sweeps.record.runfolder import atomic_write
from cart_sweeps.sweep.local_controller import GRACE_S
from cart_sweeps.sweep.pool import Task

POLL_S = 0.01  # how often an idle worker looks for its next run (a slot waits no longer than this)
WATCH_S = 0.25  # how often a worker looks for a cancel or a timeout of its run; its end wakes it at once
_FORK = multiprocessing.get_context("fork")


def mail(mailbox: Path, n: int, kind: str) -> Path:
    """Run n's file of `kind` in a worker's mailbox: task, cancel, result or exit (see above)."""
    return mailbox / f"{n}.{kind}"


def _preload(modules: tuple[str, ...]) -> None:
    """What every run imports (and `modules`, what this stage's runs import besides), imported once, then
    frozen out of the garbage collector.

    Nothing here may initialise CUDA or run a torch op (threads and a CUDA context do not survive a fork);
    with PYTORCH_NVML_BASED_CUDA_CHECK=1, torch answers `torch.cuda.is_available()` through NVML instead
    of initialising CUDA. Frozen (Python's advice for a process that forks), the objects imported here are
    no longer walked by each run's full collections: a run's first one walked all of torch's and spent
    0.25-0.33 s of its start, copying the worker's memory pages it touched as it went."""
    import cart_sweeps.run  # noqa: F401
    import cart_sweeps.train.output  # noqa: F401
    from cart_sweeps.train.metrics import software

    software()  # git and the package versions, once per worker (a `git` process per run cost ~10 ms)
    for module in modules:
        importlib.import_module(module)
    gc.freeze()  # once: what each run's task adds stays collectable, so a worker of 10,000 runs does not grow


def _check_data(task: Task) -> None:
    """The run's data checked here, so that each fork inherits the bins' hashes (data.manifest.check_prepared).
    Only a head start: whatever is wrong with the data, the run checks again and reports it in its own folder,
    so nothing here may end the worker."""
    from cart_sweeps.data.manifest import check_prepared

    with contextlib.suppress(Exception):
        check_prepared(task.cfg.data)


def _end_with(worker: int) -> None:
    """A run outlives no worker: when the worker is gone, the run stops as on Ctrl-C, then for good."""
    while os.getppid() == worker:
        time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)


def _end_with_controller(controller: int, orphaned: threading.Event) -> None:
    """A worker outlives no controller (its parent, which ties it to the driver): when the controller is gone
    (kill -9), the worker stops its run as on Ctrl-C and exits, so the driver's next worker for this slot
    never runs beside it."""
    while os.getppid() == controller:
        time.sleep(0.2)
    orphaned.set()
    os.kill(os.getpid(), signal.SIGINT)


def _run(task: Task, result: Path, worker: int) -> None:
    """The forked process of one run: the Task, as a cold job would call it; its outcome beside it."""
    threading.Thread(target=_end_with, args=(worker,), daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGUSR2):  # submitit's handlers in the worker are about the worker
        signal.signal(sig, signal.SIG_DFL)
    outcome: tuple[str, Any]
    try:
        outcome = ("success", task())
    except Exception as err:  # the run's own traceback is in its run.log
        outcome = ("error", f"{type(err).__name__}: {err}")
    atomic_write(result, lambda tmp: tmp.write_bytes(pickle.dumps(outcome)))
    sys.exit(0 if outcome[0] == "success" else 1)


@dataclass
class Worker:
    """The job a slot keeps running: it takes runs from `mailbox` in order, one at a time, each in a fork."""

    mailbox: str
    env: dict[str, str]
    timeout_s: float  # a run's wall-time limit (launcher.timeout_min)
    modules: tuple[str, ...] = ()  # imported before the first run too (LocalPool's `preloads`)

    def __call__(self) -> None:
        os.environ.update(self.env, PYTORCH_NVML_BASED_CUDA_CHECK="1")  # before torch is imported (see _preload)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the controller's stop: see `serve`
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.orphaned = threading.Event()
        threading.Thread(target=_end_with_controller, args=(os.getppid(), self.orphaned), daemon=True).start()
        _preload(self.modules)
        self.serve(Path(self.mailbox))

    def serve(self, mailbox: Path) -> None:
        """Run after run until stopped; a stop (SIGINT from the controller) stops the current run first."""
        child: BaseProcess | None = None
        n = 0
        try:
            for n in count():
                while not mail(mailbox, n, "task").exists():
                    time.sleep(POLL_S)
                task = pickle.loads(mail(mailbox, n, "task").read_bytes())
                _check_data(task)
                child = _FORK.Process(target=_run, args=(task, mail(mailbox, n, "result"), os.getpid()))
                child.start()
                timed_out = self.watch(child, mailbox, n)
                _record_exit(mailbox, n, child, timed_out)
                child = None
        except KeyboardInterrupt:
            if child is not None and child.pid is not None:
                _stop(child)
                _record_exit(mailbox, n, child, timed_out=False, orphaned=self.orphaned.is_set())

    def watch(self, child: BaseProcess, mailbox: Path, n: int) -> bool:
        """Wait for the run to end, stopping it when cancelled or out of time; whether it ran out of time.
        The wait blocks on the child's sentinel: a few wake-ups a second while the run trains."""
        deadline = time.monotonic() + self.timeout_s
        while child.exitcode is None:
            wait([child.sentinel], WATCH_S)
            cancelled = mail(mailbox, n, "cancel").exists()
            if child.exitcode is None and (cancelled or time.monotonic() > deadline):
                _stop(child)
                return not cancelled
        return False


def _stop(child: BaseProcess) -> None:
    """SIGINT (the run records itself interrupted), then SIGKILL after the grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signal.SIGINT)  # type: ignore[arg-type]  # started: it has a pid
    child.join(GRACE_S)
    if child.exitcode is None:
        child.kill()
    child.join()


def _record_exit(mailbox: Path, n: int, child: BaseProcess, timed_out: bool, orphaned: bool = False) -> None:
    record = {"pid": child.pid, "code": child.exitcode, "timed_out": timed_out, "orphaned": orphaned}
    atomic_write(mail(mailbox, n, "exit"), lambda tmp: tmp.write_text(json.dumps(record)))
