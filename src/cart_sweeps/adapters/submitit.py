"""submitit's local job controller and its start: internals the project's local pool replaces to own the job's
process group (sweep/pools/local.py, sweep/local_controller.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
from abc import abstractmethod
from pathlib import Path
from typing import Any

import submitit
from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE, Controller

__all__ = ["LOCAL_REQUEUE_RETURN_CODE", "Controller", "SessionExecutor", "local_controller"]


def local_controller(folder: Path) -> Controller:
    """submitit's `submitit.local.local.Controller` of the job in `folder` (undocumented: submitit runs it only as
    `python -m submitit.local._local`, whose process group and signals the project needs to own). The project calls
    its `start_tasks`, `wait`, `kill_tasks`, and reads `tasks` and `pid`. Checked on submitit 1.5.0 and 1.5.4."""
    return Controller(folder)


class SessionExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor starting each job's controller as `controller` (a command, given the job's folder)
    in a session of its own, with `env` added to its environment; `cuda_devices` is the next job's
    CUDA_VISIBLE_DEVICES as given (an index, a GPU UUID or a MIG id: submitit's own parameter takes ints only).

    Overrides `Executor._submit_command` (private: the one step where submitit starts a local job; its
    `start_controller` takes no session, command or devices as text), with the environment `Controller` reads.
    Checked on submitit 1.5.0 and 1.5.4."""

    cuda_devices = ""

    @abstractmethod
    def controller(self) -> tuple[list[str], dict[str, str]]:
        """The controller's command (its last argument the job's folder) and what it adds to the environment."""

    def _submit_command(self, command: str) -> submitit.LocalJob[Any]:
        p = self.parameters
        ntasks = p.get("tasks_per_node", 1)
        controller, extra = self.controller()
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
            **extra,
        }
        setup = list(p.get("setup", ()))
        args: Any = " && ".join([*setup, "exec " + shlex.join(controller)]) if setup else controller
        process = subprocess.Popen(args, shell=bool(setup), env=env, start_new_session=True)
        return submitit.LocalJob(
            folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks))
        )
