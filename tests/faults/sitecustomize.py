"""Fault injection for the tests: real processes stopped or broken at an exact point.

A test puts this folder on PYTHONPATH and names one fault in CART_FAULT; every Python process of a stage
(the driver, each job's controller, each warm worker) imports `sitecustomize` at start-up, and the process the
fault is about stops or fails there, so the test can kill it at the worst moment rather than by timing.

    CART_FAULT=<point>:<action>[:<n>[:<where>]]

points   queue   the driver: a run's trial is started in the ledger, its job not yet submitted
         submit  the driver: a job's controller has started, its pickle is not yet handed over
         task    a job's task process (a warm worker) starting, before it imports submitit or the project
         step    a run, before its n-th training step in this process (n defaults to 1)
         save    a run, with its n-th checkpoint written to the temp file, not yet renamed into place
         build   the analysis, its tables and findings.json written beside OUT, report.md not yet
         swap    the analysis, the new folder swapped in for OUT, the old one beside it not yet settled
         clock   every process of the stage, from its start: a host whose clock is behind (datetime's now)
actions  pause   write this process's pid to $CART_FAULT_MARK, then sleep until killed
         raise   raise RuntimeError("injected fault ...") (step only)
         lost-sigint   SIGINT delivered inside a weakref callback, where Python prints "Exception ignored"
                 and drops the KeyboardInterrupt (as it did inside torch.compile), then carry on
         behind  read the clock n seconds behind the true time (clock only)
where    only in runs whose folder path contains this text (step, save)
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys
import time
import weakref
from datetime import datetime, timedelta
from pathlib import Path

SPEC = os.environ.get("CART_FAULT", "")
POINT, ACTION, COUNT, WHERE = ([*SPEC.split(":"), "", "", ""])[:4] if SPEC else ("", "", "", "")
N = int(COUNT or 1)
_calls = {"n": 0}
_run_dir = {"path": ""}


class Garbage:
    """An object to collect."""


def hit(what: str) -> None:
    """The fault itself: stop here until killed, fail, or lose a Ctrl-C."""
    if ACTION == "raise":
        raise RuntimeError(f"injected fault: {what}")
    if ACTION == "lost-sigint":
        garbage = Garbage()
        watch = weakref.ref(garbage, lambda _: os.kill(os.getpid(), signal.SIGINT))
        del garbage  # the callback runs now, and the handler's KeyboardInterrupt is raised inside it
        assert watch() is None
        return
    mark = os.environ.get("CART_FAULT_MARK")
    if mark:
        Path(mark).write_text(f"{os.getpid()}\n")
    time.sleep(3600)


def counted(what: str) -> None:
    """Hit on the N-th call in a run the fault is about."""
    if WHERE and WHERE not in _run_dir["path"]:
        return
    _calls["n"] += 1
    if _calls["n"] == N:
        hit(what)


class After(importlib.abc.MetaPathFinder):
    """Patch module `name` right after it is first imported."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


def wrap(owner, attr: str, before=None, after=None) -> None:
    original = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        if before:
            before(*args, **kwargs)
        out = original(*args, **kwargs)
        if after:
            after(*args, **kwargs)
        return out

    setattr(owner, attr, wrapper)


def _patch_run(module) -> None:
    wrap(module, "execute", before=lambda cfg, run_dir, *_: _run_dir.update(path=str(run_dir)))
    if POINT == "step":
        wrap(module, "train_step", before=lambda *a, **k: counted("before a training step"))


def _patch_torch(module) -> None:
    def saved(obj, f, *args, **kwargs) -> None:
        if "checkpoints" in str(f):
            counted(f"checkpoint written to {f}, not yet renamed")

    wrap(module, "save", after=saved)


class Behind(datetime):
    """datetime, whose now() reads N seconds behind (CART_FAULT=clock:behind:N); a class of this module, so its
    values pickle to and from the stage's other processes, which all import it."""

    @classmethod
    def now(cls, tz=None):
        return super().now(tz) - timedelta(seconds=N)


def _patch_ledger(module) -> None:
    wrap(module.Ledger, "start", after=lambda *a, **k: hit("trial started, job not submitted"))


def _patch_report(module) -> None:
    wrap(module, "_markdown_report", before=lambda *a, **k: hit("the analysis half built"))


def _patch_output(module) -> None:
    wrap(module, "_exchange", after=lambda *a, **k: hit("the new analysis swapped in, the old one not settled"))


def _patch_submitit(module) -> None:
    wrap(module.JobPaths, "move_temporary_file", before=lambda *a, **k: hit("controller started, pickle not moved"))


if POINT == "task" and "submitit.core._submit" in sys.orig_argv:
    hit("task starting")
elif POINT == "clock":  # before any other module takes the name datetime from its module
    sys.modules["datetime"].datetime = Behind
elif POINT == "queue":
    sys.meta_path.insert(0, After("cart_sweeps.stagerecord.ledger", _patch_ledger))
elif POINT == "submit":
    sys.meta_path.insert(0, After("submitit.core.utils", _patch_submitit))
elif POINT == "build":
    sys.meta_path.insert(0, After("cart_sweeps.analysis.report", _patch_report))
elif POINT == "swap":
    sys.meta_path.insert(0, After("cart_sweeps.analysis.output", _patch_output))
elif POINT in ("step", "save"):
    sys.meta_path.insert(0, After("cart_sweeps.run", _patch_run))
    if POINT == "save":
        sys.meta_path.insert(0, After("torch", _patch_torch))
