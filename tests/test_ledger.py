"""The ledger file under concurrent openers (a driver starting while `plan`, the dashboard or a test reads), and
its trials read back."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from cart_sweeps.record.summary import RunSummary
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.ledger import Ledger
from cart_sweeps.sweep.trials import all_trials


def open_when_released(sweep_dir: str, barrier) -> None:
    barrier.wait()
    Ledger.open(Path(sweep_dir), "1", "sqlite")


@pytest.mark.slow  # a race, tried 8 times with 8 processes: the full tier
def test_processes_opening_a_new_ledger_at_once_all_succeed(tmp_path):
    """Optuna creates SQLite tables check-then-create; unguarded, about one opener in five failed."""
    spawn = multiprocessing.get_context("spawn")
    for attempt in range(8):
        sweep_dir = tmp_path / str(attempt)
        barrier = spawn.Barrier(3)
        procs = [spawn.Process(target=open_when_released, args=(str(sweep_dir), barrier)) for _ in range(3)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(120)
        assert [proc.exitcode for proc in procs] == [0, 0, 0], f"attempt {attempt}: an opener failed"
        assert Ledger.read(sweep_dir, "1", "sqlite") is not None  # one study "1", readable
        assert [p.name for p in sweep_dir.iterdir()] == ["ledger.db"]  # no temp file left behind


def exactly(trial: FrozenTrial) -> str:
    """Every field of a trial, each float exactly as stored (`==` takes no NaN for itself)."""
    return repr(sorted((k, sorted(v.items()) if isinstance(v, dict) else v) for k, v in vars(trial).items()))


def test_trials_read_with_sql_are_optunas_own(tmp_path):
    """`all_trials` (SQL on Optuna's tables) gives exactly `get_trials`, for every kind of trial a ledger holds,
    in a storage that also holds another study."""
    ledger = Ledger.open(tmp_path, "1", "sqlite", objective={"metric": "ppl"})
    other = Ledger.open(tmp_path, "1", "sqlite", objective={"metric": "loss"})  # "1~<digest>", same file
    grid = {"model.d_model": CategoricalDistribution([256, 1024]), "seed": IntDistribution(0, 10_000)}
    for study_ledger, seed in ((ledger, 42), (other, 7)):
        attrs = {"run_id": f"r{seed}", "label": f"d256-s{seed}", "overrides": ["stage=1", f"seed={seed}"]}
        done = study_ledger.start({"model.d_model": 256, "seed": seed}, grid, attrs)
        done.report(3.5, step=20)
        done.report(float("nan"), step=40)
        study_ledger.finish(done, RunSummary(RunStatus.COMPLETED, metrics={"ppl": 2.25}, step=40), "ppl")
    ledger.start({"model.d_model": 1024, "seed": 1}, grid, {"run_id": "running"})  # cut off: RUNNING
    failed = ledger.start({"model.d_model": 1024, "seed": 2}, grid, {"run_id": "failed"})
    ledger.finish(failed, RunSummary(RunStatus.FAILED, error="CUDA out of memory"), "ppl")
    pruned = ledger.start({"model.d_model": 256, "seed": 3}, grid, {"run_id": "pruned"})
    pruned.report(float("inf"), step=10)
    ledger.finish(pruned, RunSummary(RunStatus.PRUNED, metrics={"ppl": 9.0}), "ppl")
    search = ledger.ask()  # a search's trial: the sampler's params, a log-scale float, a worst-case value
    search.suggest_float("trainer.lr", 1e-5, 1e-2, log=True)
    search.suggest_categorical("note", [None, "a", 1.5])
    ledger.study.tell(search, float("inf"))
    ledger.study.enqueue_trial({"model.d_model": 256, "seed": 4}, user_attrs={"run_id": "queued"})  # WAITING

    rereads = Ledger.read_all(tmp_path, "1", "sqlite")  # fresh readers, as plan and the analysis open them
    for reread in rereads:
        for states in (None, (TrialState.WAITING,), (TrialState.COMPLETE, TrialState.RUNNING)):
            expected = reread.study.get_trials(deepcopy=False, states=states)
            assert [exactly(t) for t in all_trials(reread.study, states)] == [exactly(t) for t in expected]
    assert [len(all_trials(r.study)) for r in rereads] == [6, 1]  # each study its own trials, none of the other's
    states = {t.state for t in all_trials(Ledger.read(tmp_path, "1", "sqlite").study)}
    assert states == {TrialState.COMPLETE, TrialState.RUNNING, TrialState.FAIL, TrialState.PRUNED, TrialState.WAITING}
