"""Stopping a stage: every process it started ends within seconds of its driver, however and whenever the
driver ends, and a terminal's Ctrl-C reaches the driver alone (no job tracebacks on the user's screen).

Each test stops a real process at an exact moment with a fault from tests/faults (a pause), then ends
the driver there with SIGINT, SIGTERM or SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from optuna.trial import TrialState
from stages import sweep, sweep_cmd, trials, wait_for, wait_until_gone, with_fault

pytestmark = pytest.mark.slow  # kills drivers at 4 moments x 3 signals: the full tier (make test-full)

GRID = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2,4", "model.n_prelude=2", "trainer.steps=40"]
MOMENTS = {
    "before its job starts": "submit:pause",  # the driver, between a controller's start and its pickle's hand-over
    "while a worker imports": "task:pause",
    "mid-run": "step:pause:3",
    "while a run saves": "save:pause",  # a checkpoint in its temp file, not yet renamed into place
}
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 130, signal.SIGKILL: -signal.SIGKILL}


def start_paused(runs: Path, fault: str) -> tuple[subprocess.Popen[str], Path]:
    """A driver (its own process group, as in a terminal) whose stage is paused at `fault`."""
    mark, log = runs.parent / "mark", runs.parent / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            sweep_cmd(*GRID),
            env=with_fault(runs, fault, mark),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    wait_for(mark.exists, 180, f"the stage to reach {fault}", log)
    return driver, log


@pytest.mark.parametrize("sig", list(EXIT), ids=lambda s: s.name)
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_every_process_ends_with_its_driver(tmp_path, data_cache, moment, sig):
    runs = tmp_path / "runs"
    driver, log = start_paused(runs, MOMENTS[moment])
    os.kill(driver.pid, sig)
    assert driver.wait(30) == EXIT[sig], log.read_text()[-3000:]
    wait_until_gone(runs, 10)


def test_ctrl_c_in_a_terminal_reaches_only_the_driver(tmp_path, data_cache):
    """A terminal sends SIGINT to its whole foreground process group: the jobs must not be in it."""
    runs = tmp_path / "runs"
    driver, log = start_paused(runs, MOMENTS["mid-run"])
    os.killpg(driver.pid, signal.SIGINT)
    assert driver.wait(30) == 130
    wait_until_gone(runs, 10)
    said = log.read_text()
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said[-3000:]
    assert "interrupted after" in said
    summaries = [Path(t.user_attrs["run_dir"]) / "summary.json" for t in trials(runs)]
    started = [json.loads(path.read_text()) for path in summaries if path.exists()]
    assert started and all(s["status"] == "interrupted" for s in started)  # each run the driver stopped says so


def test_a_run_killed_while_saving_resumes_from_the_checkpoint_before(tmp_path, data_cache):
    """kill -9 of the driver with a checkpoint half-saved: the relaunch completes every run, none twice."""
    runs = tmp_path / "runs"
    driver, _ = start_paused(runs, "save:pause:2")  # the second checkpoint: the first one is whole
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(30)
    wait_until_gone(runs, 10)
    proc = sweep(runs, *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 cut off, resumed" in proc.stdout
    done = trials(runs)
    assert len(done) == 2 and {t.state for t in done} == {TrialState.COMPLETE}
    for trial in done:
        log = (Path(trial.user_attrs["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        steps = [json.loads(line)["step"] for line in log if json.loads(line)["kind"] == "train"]
        assert steps == sorted(set(steps)) and steps[-1] == 40  # every logged step once
