"""A stage job's own output (stdout, stderr, a traceback) appended to <run_dir>/run.log, beside the run it
explains (submitit keeps only its own lines)."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

LOG_NAME = "run.log"


def run_log(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOG_NAME


@contextlib.contextmanager
def output_to_run_log(run_dir: str | Path) -> Iterator[Path]:
    """File descriptors 1 and 2 (Python's prints, C libraries, child processes) go to run.log meanwhile;
    an exception leaving the block is written there with its traceback, then raised on."""
    path = run_log(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab", buffering=0) as log, open(path, "a", buffering=1) as text:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):  # also a replaced sys.stdout
                yield path
        except BaseException:
            traceback.print_exc(file=text)
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
