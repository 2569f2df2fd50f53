"""`plan`'s time on this machine (sweep/pace.py): a stage's start, each run's fixed costs beside its FLOPs,
calibrated from the runs this machine finished, else from a benchmark cached per machine; searches costed from
n_trials, ladders per rung, finished stages `done`. How close it comes to the actual wall time is measured by
`python -m cart_sweeps.bench_plan` (docs/paper-scale.md), not here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import pytest
from stages import sweep, trials

from cart_sweeps import plan
from cart_sweeps.config import ModelConfig
from cart_sweeps.model import train_flops_per_token
from cart_sweeps.sweep.pace import Pace, benchmark_path, finished_here

# A benchmark as `python -m cart_sweeps.bench_pace` records one (sweep/pace.py): plan reads it, measures nothing.
RECORD = {
    "driver_start_s": 2.0,
    "worker_start_s": 3.0,
    "compose_s": 1.0,
    "run_setup_s": 0.25,
    "checkpoint_s": 0.05,
    "flops_per_s": 8e9,
    "load": 0.5,
    "measured": "2026-01-01T00:00:00",
}


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """This machine's benchmark record in a user cache of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path / "runs"))
    path = benchmark_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"machine": path.stem, **RECORD}))
    return tmp_path / "runs"


def test_without_finished_runs_the_pace_is_the_machines_benchmark(recorded):
    """The stage's start is the driver's and a worker's start and a composition; a run's fixed cost its setup and
    checkpoint besides its composition; the rate one process's, shared where the slots outnumber the cores."""
    cores = os.cpu_count() or 1
    pace = Pace.here(recorded, slots=2 * cores)
    assert pace.stage_start_s == pytest.approx(2.0 + 3.0 + 1.0)
    assert pace.run_fixed_s == pytest.approx(1.0 + 0.25 + 0.05)
    assert pace.flops_per_s == pytest.approx(8e9 / 2)
    assert Pace.here(recorded, slots=1).flops_per_s == pytest.approx(8e9)
    assert pace.run_seconds(4e9, 0.0) == pytest.approx(1.3 + 1.0)  # 4 GFLOP at 4 GFLOP/s, and its fixed cost
    assert "a benchmark of this machine (2026-01-01T00:00:00)" == pace.basis


def here_line(capsys, *args: str) -> str:
    plan.main(list(args))
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("on this machine"))


@pytest.mark.slow  # plan of a stage: 4 s on 2 loaded cores
def test_a_search_is_costed_for_its_n_trials(recorded, capsys):
    """No trial sampled yet: 12 runs, each its space's corners on average, not "0 runs" and no time."""
    line = here_line(capsys, "stage=lr", "scale=tiny", "sweep.sampler=tpe", "sweep.n_trials=12", "launcher.slots=2")
    assert re.match(r"on this machine: about \d+ (s|min) for 12 runs on 2 slots \(6 s to start", line), line
    assert "a run 1.3 s besides its FLOPs" in line


@pytest.mark.slow  # plan of a stage: 4 s on 2 loaded cores
def test_a_ladder_reads_per_rung_in_time_not_zero_gpu_hours(recorded, capsys):
    """The ladder's later rungs are in the stage's time, and each rung line reads in minutes or seconds, its
    rungs longer as their runs train more steps."""
    args = ["stage=ladder", "scale=tiny", "model.d_model=256", "model.n_loops=2,8", "model.n_prelude=6"]
    plan.main([*args, "stage.rungs=[1000,4000,9000]", "launcher.slots=2"])
    out = capsys.readouterr().out
    assert "on this machine: about" in out and "for 12 runs on 2 slots" in out  # 4 configurations x 3 rungs
    rungs = re.findall(r"rung \d \([\d,]+ paper steps: \d+ here\): at most 6 runs, (\d+) (s|min) of run time;", out)
    assert len(rungs) == 3 and "GPU-hours" not in out.split("ladder:")[1], out
    seconds = [int(n) * (60 if unit == "min" else 1) for n, unit in rungs]
    assert seconds == sorted(seconds) and seconds[0] > 0


@pytest.mark.slow  # a real stage: ~20 s on 2 cores
def test_finished_runs_calibrate_the_pace_and_a_finished_stage_is_done(recorded, capsys, data_cache):
    runs = recorded
    grid = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2", "seed=42,137"]
    grid += ["trainer.steps=4"]
    done = sweep(runs, *grid, "launcher.slots=2")
    assert done.returncode == 0, done.stderr[-2000:]
    by_hand = []  # each run's slot time less its training and evaluation, from the ledger and its summary
    for trial in trials(runs):
        s = json.loads((Path(trial.user_attrs["run_dir"]) / "summary.json").read_text())
        t = s["trainer"]
        slot = (trial.datetime_complete - trial.datetime_start).total_seconds()
        train = s["step"] * t["micro_batch_size"] * t["grad_accum"] * t["seq_len"] / s["tokens_per_s"]
        per_token = train_flops_per_token(ModelConfig(**s["model"]), t["seq_len"])
        sets = len([k for k in s if k.startswith("ce_")])
        evals = -(-s["step"] // t["eval_every"])
        evaluated = evals * t["eval_windows"] * t["seq_len"] * sets * per_token / 3 / (s["tokens_per_s"] * per_token)
        by_hand.append(slot - train - evaluated)
    finished = finished_here(runs)
    assert sorted(f.fixed_s for f in finished) == pytest.approx(sorted(by_hand))
    pace = Pace.here(runs, slots=2)
    assert pace.basis == "2 runs finished here"
    assert pace.run_fixed_s == pytest.approx(median(max(0.0, f) for f in by_hand))
    assert pace.stage_start_s == pytest.approx(6.0)  # the benchmark's: finished runs do not show the driver's start
    assert here_line(capsys, *grid) == "on this machine: done (its 2 runs have their results)"
    wider = here_line(capsys, *grid[:-1], "trainer.steps=6", "launcher.slots=2")
    assert "for 2 runs on 2 slots" in wider and "from 2 runs finished here" in wider
    # ranked by throughput, measured two at a time on this machine's cores: said, with the seeds' spread
    rates = [
        json.loads((Path(t.user_attrs["run_dir"]) / "summary.json").read_text())["tokens_per_s"] for t in trials(runs)
    ]
    plan.main([*grid, "launcher.slots=2", "sweep.metric=tokens_per_s"])
    said = capsys.readouterr().out
    spread = (max(rates) - min(rates)) / median(rates)
    assert (
        f"tokens_per_s is measured with 2 runs on this machine's {os.cpu_count()} cores at once: across the seeds "
        f"of one configuration it spread by up to {spread:.0%} (median {spread:.0%}, 1 configuration)" in said
    ), said
    # a runs folder shared by machines: a run whose summary names another host is not this machine's
    path = Path(trials(runs)[0].user_attrs["run_dir"]) / "summary.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps({**summary, "env": {**summary["env"], "host": "elsewhere"}}))
    assert len(finished_here(runs)) == 1


def clock_seconds(pattern: str, text: str) -> int:
    """The seconds of the first `MmSSs` that `pattern` finds in `text` (cart_sweeps.text.clock's form)."""
    found = re.search(pattern, text)
    assert found is not None, text[-2000:]
    return 60 * int(found[1]) + int(found[2])


@pytest.mark.slow  # a fresh data cache: tokenizing the embedded corpus, ~50 s on 2 cores
def test_the_driver_prepares_a_fresh_caches_data_before_the_first_run_saying_so(tmp_path):
    """The runs do not wait in silence on the first one tokenizing: the driver says what it prepares, where, and
    how long it took, before any run starts, so the stage's ETA is the runs' pace alone."""
    cache = tmp_path / "cache"
    grid = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2,4", "model.n_prelude=2", "trainer.steps=2"]
    started = time.monotonic()
    done = sweep(tmp_path / "runs", *grid, "launcher.slots=2", CART_SWEEPS_CACHE=str(cache))
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    # the progress clock (its ETA, its closing "finished in") starts once the data is ready: counting the preparation
    # would make the two together longer than the command's wall time by the preparation's length
    preparing_s = clock_seconds(r"data=embedded prepared in (\d+)m(\d\d)s", done.stdout)
    took_s = clock_seconds(r"finished in (\d+)m(\d\d)s", done.stderr)
    assert preparing_s + took_s <= wall, (preparing_s, took_s, wall)
    said = done.stdout.splitlines()  # the stage's own lines (a run's end goes to stderr, with the progress line)
    preparing = next(i for i, line in enumerate(said) if "preparing data=embedded for its runs, once" in line)
    prepared = next(i for i, line in enumerate(said) if re.match(r"stage 1: data=embedded prepared in \dm\d\ds", line))
    folder = next(cache.glob("data/embedded-*/manifest.json")).parent
    assert str(folder) in said[preparing] and "validation sets shakespeare, bible, austen" in said[preparing]
    assert preparing < prepared


@pytest.mark.slow  # a real stage, planned twice in processes of their own: ~30 s on 2 cores
def test_bench_plan_prints_the_estimate_beside_the_actual_wall_time(tmp_path, data_cache):
    grid = "stage=1 scale=tiny model.d_model=256 model.n_loops=2,4 model.n_prelude=2 trainer.steps=2 launcher.slots=2"
    command = [sys.executable, "-m", "cart_sweeps.bench_plan", "--calls", "2", "--runs", str(tmp_path / "runs"), grid]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    header, _, row = done.stdout.splitlines()[-3:]
    assert header.startswith("| stage | runs | slots | estimate s | spread | actual s | est/actual | load")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["1", "2", "2"] and cells[4] == "0%"  # two calls, one record: one estimate
    assert float(cells[6]) == pytest.approx(float(cells[3]) / float(cells[5]), rel=0.1)  # of rounded figures
