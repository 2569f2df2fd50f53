"""The controller of a local job: submitit's own, leading a process group of its own, ended with its driver.

submitit starts a local job's controller in the driver's process group with no tie to the driver, so a
terminal's Ctrl-C reached controllers and tasks (and printed their tracebacks), and a driver killed
between starting a controller and handing it its pickle left a task waiting 60 s for a pickle that never
came. Here the driver starts this module as the leader of a new session (LocalExecutor below): only the
driver hears the terminal, and the whole job is one process group. The controller watches its parent and
ends its group the moment the driver is gone, or when the driver asks (SIGTERM): SIGINT to its tasks
first, so a trainer records its run as interrupted, then SIGKILL to whatever is left.

It mirrors `submitit.local.local.Controller.run` (through cart_sweeps.adapters.submitit) and also writes the tasks'
exit codes beside the job's logs, so the driver can say how a task died.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from cart_sweeps.adapters.submitit import LOCAL_REQUEUE_RETURN_CODE, Controller, local_controller

DRIVER_ENV = "CART_SWEEPS_DRIVER_PID"
GRACE_S = 5.0  # how long a task may take to record its interruption before the group is killed
_MAX_REQUEUES = 6  # submitit's own bound on local requeues of one job


def exit_codes_path(folder: Path, job_id: str) -> Path:
    return folder / f"{job_id}_exit.json"


_stopping = threading.Event()


def stop_group(controller: Controller) -> None:
    """SIGINT to the tasks, a grace period, then SIGKILL to the whole group (this process included)."""
    _stopping.set()
    tasks = list(controller.tasks)
    for task in tasks:
        with contextlib.suppress(OSError):
            task.send_signal(signal.SIGINT)
    deadline = time.monotonic() + GRACE_S
    while any(task.poll() is None for task in tasks) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _watch(driver: int, controller: Controller) -> None:
    """The driver's death reparents this process: then stop everything this job started."""
    while os.getppid() == driver:
        time.sleep(0.1)
    stop_group(controller)


def run(controller: Controller, folder: Path) -> None:
    """submitit's start / wait / requeue loop, recording the exit codes of the last round."""
    codes: list[int | None] = []
    for _ in range(_MAX_REQUEUES):
        try:
            controller.start_tasks()
            codes = list(controller.wait())
        finally:
            controller.kill_tasks()
        if LOCAL_REQUEUE_RETURN_CODE not in codes:
            break
    exit_codes_path(folder, controller.pid).write_text(json.dumps(codes))


def main(folder: str) -> None:
    driver = int(os.environ[DRIVER_ENV])
    controller = local_controller(Path(folder))
    signal.signal(signal.SIGTERM, lambda *_: stop_group(controller))
    threading.Thread(target=_watch, args=(driver, controller), daemon=True).start()
    run(controller, Path(folder))
    if _stopping.is_set():  # the tasks ended within the grace period: still end what they left behind
        os.killpg(os.getpgrp(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1])
