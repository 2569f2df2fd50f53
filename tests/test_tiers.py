"""How `make test` shares the tests out: two pytest-xdist workers, each group of tests/conftest.py on one."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from cart_sweeps.config import REPO_ROOT


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_the_slurm_tests_run_on_one_worker_under_make_tests_options():
    """Under `-n 2 --dist loadgroup` (the Makefile's) every SLURM test carries its group and runs on one worker:
    a pytest or pytest-xdist that drops the groups (pytest 9 with xdist 3.8 did, silently) fails here."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v"]
    done = subprocess.run([*command, "tests/test_slurm_smoke.py"], cwd=REPO_ROOT, capture_output=True, text=True)
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] \w+ (tests/\S+)", done.stdout)
    assert len(ran) == 3, done.stdout[-2000:]
    assert all(test.endswith("@slurm") for _, test in ran), ran
    assert len({worker for worker, _ in ran}) == 1, ran
