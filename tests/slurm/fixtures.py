"""pytest fixtures for the real SLURM cluster that tests/slurm/cluster.sh starts.

`slurm_cluster` (session) answers whether a cluster is there: it skips with a one-line reason when
`sinfo` is missing or no cluster answers (or fails instead, when CART_SLURM_REQUIRED=1, as CI may
set once it has run `cluster.sh start`), and otherwise yields a SlurmCluster (partition, node, CPUs).
It never starts or mocks anything.

Load it with `pytest_plugins = ["slurm.fixtures"]` in tests/conftest.py, or import it into a test
module (`from slurm.fixtures import slurm_cluster  # noqa: F401`).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest

START_HINT = "bash tests/slurm/cluster.sh install && bash tests/slurm/cluster.sh start"
USABLE_STATES = {"idle", "mix", "mixed", "alloc", "allocated", "comp", "completing"}


@dataclass(frozen=True)
class SlurmCluster:
    partition: str  # the default partition
    nodes: tuple[str, ...]  # nodes of that partition that take jobs
    cpus: int  # CPUs in that partition


def _run(cmd: list[str], timeout: float = 15) -> tuple[bool, str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{cmd[0]}: {e}"
    text = (out.stdout or out.stderr).strip()
    return out.returncode == 0, text


def _no_cluster(reason: str) -> None:
    if os.environ.get("CART_SLURM_REQUIRED") == "1":
        pytest.fail(f"SLURM required (CART_SLURM_REQUIRED=1) but {reason}", pytrace=False)
    pytest.skip(f"{reason} (start one: {START_HINT})")


def _controller_refuses() -> str | None:
    """A reason when there is no slurm.conf, or it names a controller address where nothing
    listens; else None. sinfo retries a missing config for 60 s and a controller that is down for
    ~9 s; this says so at once.
    """
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    try:
        text = open(conf).read()
    except FileNotFoundError:  # sinfo would retry for 60 s
        return f"no SLURM config at {conf} (set SLURM_CONF for a config elsewhere)"
    except OSError:
        return None
    host = re.search(r"^\s*SlurmctldHost\s*=\s*[^(\s#]+\(([^)\s]+)\)", text, re.M | re.I)
    port = re.search(r"^\s*SlurmctldPort\s*=\s*(\d+)", text, re.M | re.I)
    if host is None:  # no literal address: leave it to sinfo (no name lookups here)
        return None
    addr, portno = host.group(1), int(port.group(1)) if port else 6817
    try:
        socket.create_connection((addr, portno), timeout=3).close()
    except OSError as e:
        return f"no SLURM controller listens at {addr}:{portno} ({conf}): {e.strerror or e}"
    return None


def probe() -> SlurmCluster | str:
    """The cluster that answers, or a one-line reason why there is none."""
    if shutil.which("sinfo") is None:
        return "no SLURM: sinfo not installed"
    refused = _controller_refuses()
    if refused:
        return refused
    ok, out = _run(["sinfo", "-h", "-o", "%P|%a|%t|%N|%C"])
    if not ok:
        return f"no SLURM cluster answers: {out.splitlines()[0] if out else 'sinfo failed'}"
    partition, nodes, cpus = None, [], 0
    for line in out.splitlines():
        name, avail, state, nodelist, cpu = line.split("|")
        if not name.endswith("*"):
            continue
        partition = name.rstrip("*")
        if avail == "up" and state.rstrip("*~#!%$@^-") in USABLE_STATES:
            nodes.append(nodelist)
            cpus += int(cpu.split("/")[-1])  # allocated/idle/other/total
    if partition is None:
        return "SLURM answers but has no default partition"
    if not nodes:
        return f"SLURM partition {partition} has no node taking jobs: {out.replace(chr(10), '; ')}"
    ok, out = _run(["sacctmgr", "-n", "show", "cluster"])
    if not ok:
        return f"SLURM accounting (slurmdbd) does not answer, submitit needs sacct: {out[:120]}"
    return SlurmCluster(partition=partition, nodes=tuple(nodes), cpus=cpus)


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    found = probe()
    if isinstance(found, str):
        _no_cluster(found)
    return found


def wait_done(jobs, timeout: float) -> None:
    """Wait for submitit jobs (never forever: result() of a lost job may wait for ever)."""
    deadline = time.monotonic() + timeout
    pending = list(jobs)
    while pending:
        pending = [j for j in pending if not j.done()]
        if not pending:
            return
        if time.monotonic() > deadline:
            ids = ", ".join(f"{j.job_id} ({j.state})" for j in pending)
            _, queue = _run(["squeue", "-h", "-o", "%i %T %R"])
            raise AssertionError(f"SLURM jobs not done after {timeout:.0f}s: {ids}; squeue: {queue!r}")
        time.sleep(0.5)
