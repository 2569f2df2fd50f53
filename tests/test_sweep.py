"""`python -m cart_sweeps -m`: real tiny stages through the Optuna ledger and submitit local slots.

Every run trains for real on the embedded corpus (scale=tiny); the driver is a real subprocess that is
killed and relaunched; the ledger is the real SQLite study.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from optuna.trial import TrialState
from stages import completed, env, leftovers, sweep, sweep_cmd, trials, wait_for, wait_until_gone, with_fault

from cart_sweeps.sweep.cost import Throughput, assumed_flops_per_s, launch_order, run_costs
from cart_sweeps.sweep.expand import Stage

GRID = ["stage=1", "scale=tiny", "model.d_model=256,512", "model.n_loops=2,4", "model.n_prelude=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_cache) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A 2x2 tiny grid run to the end once; later tests read and relaunch it."""
    runs = tmp_path_factory.mktemp("finished")
    return runs, sweep(runs, *GRID)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_every_run_recorded(finished):
    runs, proc = finished
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = trials(runs)
    assert len(done) == 4 and {t.state for t in done} == {TrialState.COMPLETE}
    assert len({t.user_attrs["run_id"] for t in done}) == 4
    for t in done:
        assert t.user_attrs["status"] == "completed" and t.value == t.user_attrs["results"]["ppl_austen"]
        assert Path(t.user_attrs["run_dir"]).name.endswith(t.user_attrs["run_id"][:8])
        assert (Path(t.user_attrs["run_dir"]) / "summary.json").exists()
    assert {t.params["model.d_model"] for t in done} == {256, 512}  # params in the paper's numbers
    assert "4 completed, 0 failed, 0 diverged" in proc.stderr
    assert not leftovers(runs)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_driver_launches_in_the_plans_order(finished):
    """Trials are numbered as the driver starts them: longest first by the plan's cost, not grid order."""
    runs, _ = finished
    started = [t.user_attrs["run_id"] for t in sorted(trials(runs), key=lambda t: t.number)]
    grid = Stage(GRID).runs
    at_launch = Throughput(assumed_flops_per_s("h100", 0.35))  # nothing had finished when it launched
    expected = [run.run_id for run in launch_order(grid, run_costs(grid, at_launch))]
    assert started == expected != [run.run_id for run in grid]
    widths = [next(r.config.cfg.model.d_model for r in grid if r.run_id == rid) for rid in started]
    assert widths == sorted(widths, reverse=True)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_relaunch_of_a_finished_stage_skips_everything(finished):
    runs, _ = finished
    before = {t.number: t.datetime_complete for t in trials(runs)}
    proc = sweep(runs, *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 done, skipped" in proc.stdout
    assert {t.number: t.datetime_complete for t in trials(runs)} == before


@pytest.mark.slow  # the lm-eval harness at three R: the full tier
def test_variable_r_evaluates_a_trained_run(finished):
    """Also with GPUs named by UUID and MIG id (they are passed through to the jobs; ints only crashed)."""
    runs, _ = finished
    source = next(t.user_attrs["run_dir"] for t in trials(runs) if t.params["model.n_loops"] == 4)
    evaluate = ["stage=variable_r", f"stage.source={source}", "stage.eval_n_loops=2,4,6", "sweep.metric=ppl_austen"]
    evaluate += ["harness.tasks=[cart_nextpassage]", "harness.limit=20"]  # offline; the paper's four read the hub
    gpus = "GPU-5a1f3c2e-8d4b-4f6a-9e0c-1b2d3e4f5a6b,MIG-8c7d6e5f-4a3b-2c1d-0e9f-8a7b6c5d4e3f"
    proc = sweep(runs, *evaluate, CUDA_VISIBLE_DEVICES=gpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = trials(runs, "variable_r")
    assert len(evals) == 3 and {t.state for t in evals} == {TrialState.COMPLETE}
    assert {t.params["stage.eval_n_loops"] for t in evals} == {2, 4, 6}
    assert len({t.user_attrs["run_id"] for t in evals}) == 3
    assert all(0 <= t.user_attrs["results"]["bench_cart_nextpassage_acc"] <= 1 for t in evals)  # lm-eval, in the ledger


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_plan_reads_status_from_the_ledger(finished):
    runs, _ = finished
    out = subprocess.run(
        [sys.executable, "-m", "cart_sweeps.plan", *GRID, "plan.format=csv"],
        env=env(runs),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert [line.rsplit(",", 1)[1] for line in out.stdout.splitlines()[1:]] == ["completed"] * 4


def running_jobs(runs: Path) -> set[str]:
    """The jobs of the runs running now, as the ledger names them."""
    return {t.user_attrs["job_id"] for t in trials(runs) if t.state == TrialState.RUNNING and "job_id" in t.user_attrs}


@pytest.mark.slow
def test_killed_driver_loses_nothing_and_runs_nothing_twice(tmp_path, data_cache):
    """SIGTERM stops the jobs; SIGKILL leaves jobs that end themselves; the relaunch finishes the rest.

    The first driver is stopped once a run has finished; the second while a job it started runs (after a run
    finished, its last two runs could both be done, and the driver gone, before the test saw either)."""
    runs = tmp_path
    for sig, code in ((signal.SIGTERM, 130), (signal.SIGKILL, -signal.SIGKILL)):
        n_before = len(completed(runs))
        log = runs / f"driver-{sig.name}.log"
        with open(log, "w") as out:
            driver = subprocess.Popen(sweep_cmd(*GRID), env=env(runs), stdout=out, stderr=subprocess.STDOUT)
        if sig == signal.SIGTERM:
            wait_for(lambda n=n_before: len(completed(runs)) > n, 240, "a run to finish", log)
        else:
            earlier = {t.user_attrs.get("job_id") for t in trials(runs)}  # the first driver's jobs
            wait_for(lambda e=earlier: bool(running_jobs(runs) - e), 240, "a job of the relaunch to start", log)
        driver.send_signal(sig)
        assert driver.wait(60) == code
        wait_until_gone(runs, 10)
    kept = {t.user_attrs["run_id"]: t.datetime_complete for t in completed(runs)}
    # cut off: started, or queued by a driver killed before it started them (the relaunch adopts those)
    cut_off = [t for t in trials(runs) if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    proc = sweep(runs, *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = trials(runs)
    assert len(after) == 4 == len({t.user_attrs["run_id"] for t in after})  # one trial per run, none lost
    assert {t.state for t in after} == {TrialState.COMPLETE}
    assert {k: v for k, v in ((t.user_attrs["run_id"], t.datetime_complete) for t in after) if k in kept} == kept
    done, resumed = map(int, re.search(r"(\d+) done, skipped; .* (\d+) cut off, resumed", proc.stdout).groups())
    assert done + resumed == len(kept) + len(cut_off) and done >= len(kept)  # a cut-off run may have just finished


@pytest.mark.slow
def test_failed_and_diverged_runs_are_recorded_and_the_rest_finish(tmp_path, data_cache):
    """lr=1e6 diverges (a result, not retried); an error in R=4's first step fails it (retried once, then recorded)."""
    args = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2,4", "model.n_prelude=2"]
    fault = with_fault(tmp_path, "step:raise:1:-R4-", tmp_path / "mark")
    cmd = sweep_cmd(*args, "trainer.lr=3e-4,1e6", "sweep.max_retries=1")
    proc = subprocess.run(cmd, env=fault, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    status = Counter(
        (t.params["trainer.lr"], t.params["model.n_loops"], t.user_attrs["status"]) for t in trials(tmp_path)
    )
    assert status == {
        (3e-4, 2, "completed"): 1,
        (1e6, 2, "diverged"): 1,
        (3e-4, 4, "failed"): 2,
        (1e6, 4, "failed"): 2,
    }
    assert "1 completed, 2 failed, 1 diverged" in proc.stderr
    failed = [t for t in trials(tmp_path) if t.user_attrs["status"] == "failed"]
    assert all("injected fault" in t.user_attrs["error"] for t in failed)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("model.d_model=256,100", "nor one of their widths at scale=tiny"),
        ("model.n_loops=0,2", "model.n_loops=0"),
        ("trainer.steps=10,abc", "abc"),
    ],
)
def test_bad_values_stop_the_stage_before_launch(tmp_path, bad, says):
    proc = sweep(tmp_path, "stage=1", "scale=tiny", bad, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "1").exists()


@pytest.mark.slow
def test_tpe_search(tmp_path, data_cache):
    args = ["stage=lr", "scale=tiny", "sweep.sampler=tpe", "sweep.n_trials=2", "trainer.steps=5"]
    proc = sweep(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = trials(tmp_path, "lr")
    assert len(found) == 2 and all(3e-4 <= t.params["trainer.lr"] <= 3e-3 for t in found)
    again = sweep(tmp_path, *args)
    assert again.returncode == 0 and "2 done, skipped" in again.stdout and len(trials(tmp_path, "lr")) == 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed interrupt itself
def test_an_interrupt_the_collector_swallows_still_stops_the_launch():
    """SIGTERM arriving while Python runs a weakref callback (the collector's) raises KeyboardInterrupt there,
    where Python prints "Exception ignored" and goes on: the driver's next refill raises it again (a driver once
    finished its whole stage after SIGTERM this way)."""
    import os
    import weakref

    from cart_sweeps import interrupt
    from cart_sweeps.sweep import driver

    class Collected:
        pass

    previous = interrupt.install(signal.SIGTERM)  # as `launch` does
    try:
        obj = Collected()
        ref = weakref.ref(obj, lambda _: os.kill(os.getpid(), signal.SIGTERM))
        del obj  # the callback runs, the handler raises inside it, Python swallows the exception
        assert ref() is None
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            driver.StageDriver.take(driver.StageDriver.__new__(driver.StageDriver), 1)
    finally:
        interrupt.restore(previous)
