"""`python -m cart_sweeps.bench_stage`: a stage's wall time against its runs' own time, split into start-up
and per-run overhead."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from cart_sweeps.bench_stage import RunTiming, figures


def test_the_overhead_splits_into_the_start_up_and_what_each_run_costs_its_slot():
    """Four runs of 1 s own time on 2 slots in a 5 s stage whose first step came 2 s in: 2.5x the ideal 2 s;
    after the start-up, 3 s of 2 slots (6 slot-seconds) held 4 s of runs: 0.5 s a run, 1.5x."""
    started = 1000.0
    timings = [RunTiming(started + 1.9, started + 2.0, 1.0), RunTiming(started + 1.9, started + 2.1, 1.0)]
    timings += [RunTiming(started + 3.3, started + 3.5, 1.0), RunTiming(started + 3.4, started + 3.6, 1.0)]
    got = figures(timings, slots=2, started=started, wall=5.0)
    assert got["ratio"] == pytest.approx(2.5)
    assert got["start_up_s"] == pytest.approx(2.0)
    assert got["overhead_per_run_ms"] == pytest.approx(500.0)
    assert got["ratio_after_start_up"] == pytest.approx(1.5)
    assert got["median_launch_to_first_step_s"] == pytest.approx(0.2)


def test_a_stage_of_runs_without_a_first_step_has_no_start_up():
    """An evaluate stage's runs take no training step: its start-up is unknown (NaN), the ratio still holds."""
    got = figures([RunTiming(10.0, None, 1.0)], slots=1, started=9.0, wall=2.0)
    assert got["ratio"] == pytest.approx(2.0)
    assert all(math.isnan(got[key]) for key in ("start_up_s", "overhead_per_run_ms", "median_launch_to_first_step_s"))


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_the_benchmark_runs_a_real_stage_and_prints_its_figures(tmp_path):
    grid = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2,4", "model.n_prelude=2", "trainer.steps=2"]
    done = subprocess.run(
        [sys.executable, "-m", "cart_sweeps.bench_stage", *grid, "launcher.slots=2"],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
    got = {key: float(value) for key, value in printed.items()}
    assert got["runs"] == 2 and got["slots"] == 2
    assert 0 < got["start_up_s"] < got["stage_wall_s"]
    assert got["ratio"] > got["ratio_after_start_up"] > 0
    assert got["runs_own_s"] > 0 and got["overhead_per_run_ms"] > 0
