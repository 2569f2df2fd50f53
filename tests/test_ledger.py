"""The ledger file under concurrent openers (a driver starting while `plan`, the dashboard or a test reads), and
its trials read back."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from cart_sweeps.adapters.optuna import database_of
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.stagerecord.ledger import Ledger, merged_attempts, merged_launches
from cart_sweeps.stagerecord.trials import all_trials
from cart_sweeps.status import RunStatus


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


def told_by_optuna(ledger: Ledger, trial, summary: RunSummary, metric: str) -> None:
    """What `finish` wrote before it took one transaction: Optuna's public calls, one commit each."""
    status, value = summary.status, summary.value(metric)
    trial.set_user_attr("status", status.value if status != RunStatus.COMPLETED or value is not None else "failed")
    trial.set_user_attr("results", summary.results())
    if summary.error or (status == RunStatus.COMPLETED and value is None):
        error = summary.error or f"completed without a finite {metric} (it recorded {summary.metrics.get(metric)!r})"
        trial.set_user_attr("error", error)
    if status == RunStatus.COMPLETED and value is not None:
        ledger.study.tell(trial, value)
    else:
        ledger.study.tell(trial, state=TrialState.PRUNED if status == RunStatus.PRUNED else TrialState.FAIL)


ENDINGS = {  # name: (intermediate values reported, how the run ended)
    "completed": ({20: 3.5, 40: float("nan")}, RunSummary(RunStatus.COMPLETED, metrics={"ppl": 2.25}, step=40)),
    "no finite metric": ({}, RunSummary(RunStatus.COMPLETED, metrics={"ppl": float("nan")}, step=40)),
    "failed": ({}, RunSummary(RunStatus.FAILED, error="CUDA out of memory")),
    "pruned": ({10: 7.0, 20: float("inf")}, RunSummary(RunStatus.PRUNED, metrics={"ppl": 9.0})),
    "pruned at nan": ({10: 7.0, 20: float("nan")}, RunSummary(RunStatus.PRUNED)),
    "pruned unreported": ({}, RunSummary(RunStatus.PRUNED)),
    "interrupted": ({20: 4.0}, RunSummary(RunStatus.INTERRUPTED, step=20)),
}


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize("ending", ENDINGS)
def test_finish_writes_what_optuna_tells_in_one_commit(tmp_path, ending):
    """Each way a run ends is recorded as Optuna's own calls record it (every field but the ids and times), with
    one commit instead of five."""
    from sqlalchemy import event

    reported, summary = ENDINGS[ending]
    grid = {"seed": IntDistribution(0, 10)}
    recorded = []
    for folder, end in (("ours", Ledger.finish), ("optuna", told_by_optuna)):
        ledger = Ledger.open(tmp_path / folder, "1", "sqlite", objective={"metric": "ppl"})
        trial = ledger.start({"seed": 1}, grid, {"run_id": "r1", "label": "d256-s1"})
        for step, value in reported.items():
            trial.report(value, step=step)
        commits = []
        event.listen(database_of(ledger.study).engine, "commit", lambda conn, commits=commits: commits.append(1))
        end(ledger, trial, summary, "ppl")
        if folder == "ours":
            assert len(commits) == 1
        (reread,) = all_trials(Ledger.read(tmp_path / folder, "1", "sqlite").study)
        fields = {
            k: v for k, v in vars(reread).items() if k not in ("_trial_id", "_datetime_start", "datetime_complete")
        }
        recorded.append(repr(sorted(fields.items())))
        assert reread.datetime_complete is not None
    assert recorded[0] == recorded[1]


def test_a_finish_that_fails_midway_writes_nothing_and_the_next_writes_only_its_own(tmp_path):
    """A result the ledger cannot store (a value JSON cannot encode) raises, and leaves the trial running as it
    was (a relaunch resumes it); nothing of it reaches the ledger with the next run's ending."""
    ledger = Ledger.open(tmp_path, "1", "sqlite", objective={"metric": "ppl"})
    grid = {"seed": IntDistribution(0, 10)}
    bad = ledger.start({"seed": 1}, grid, {"run_id": "bad"})
    good = ledger.start({"seed": 2}, grid, {"run_id": "good"})
    unstorable = RunSummary(RunStatus.COMPLETED, metrics={"ppl": 2.0, "note": object()}, step=40)
    with pytest.raises(TypeError):
        ledger.finish(bad, unstorable, "ppl")
    ledger.finish(good, RunSummary(RunStatus.COMPLETED, metrics={"ppl": 3.0}, step=40), "ppl")
    trials = {t.user_attrs["run_id"]: t for t in all_trials(Ledger.read(tmp_path, "1", "sqlite").study)}
    assert trials["bad"].state == TrialState.RUNNING and trials["bad"].user_attrs["status"] == "running"
    assert "results" not in trials["bad"].user_attrs and trials["bad"].values is None
    assert trials["good"].state == TrialState.COMPLETE and trials["good"].value == 3.0


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_relaunches_that_change_nothing_add_no_run_ids_to_the_ledger(tmp_path, storage):
    """Each launch's runs are kept, but a launch standing for the runs of the launch before it stores none of
    them: 100 relaunches of a 1,024-run stage wrote 1.6 MB into the study's attributes, which every relaunch, `plan`
    and analysis read back whole. A ledger written with every launch's run ids is read as before, and stored
    compactly at its next launch."""
    ledger = Ledger.open(tmp_path, "1", storage)
    grid = [f"{i:08x}" for i in range(1024)]
    narrowed = grid[:64]
    ledger.study.set_user_attr(  # as an earlier version wrote them: every launch's run ids in full
        "launches", [{"at": f"2026-01-0{day}", "args": ["stage=1"], "run_ids": grid} for day in (1, 2)]
    )
    for args, runs in [(["stage=1"], grid)] * 96 + [(["stage=1", "seed=0"], narrowed), (["stage=1"], grid)]:
        ledger.record_launch(runs, args)
    ledger.add_to_launch("sampled")  # a search's newest launch grows by the runs it samples

    read = Ledger.read(tmp_path, "1", storage)
    assert read is not None
    launches = read.launches()
    assert [len(launch["run_ids"]) for launch in launches] == [1024] * 98 + [64, 1025]
    assert launches[98]["run_ids"] == narrowed and launches[99]["run_ids"] == [*grid, "sampled"]
    assert launches[0] == {"at": "2026-01-01", "args": ["stage=1"], "run_ids": grid}
    assert [launch["args"] for launch in launches[-3:]] == [["stage=1"], ["stage=1", "seed=0"], ["stage=1"]]
    stored = len(json.dumps(read.study.user_attrs["launches"]))
    assert stored < 3 * len(json.dumps(grid)) + 100 * 200  # three run sets written out, and 100 launches' times


def record_launches(sweep_dir: str, metric: str, n: int, barrier, numbers) -> None:
    ledger = Ledger.open(Path(sweep_dir), "1", "sqlite", objective={"metric": metric})
    barrier.wait()
    numbers.extend([ledger.record_launch([f"run-{metric}"], [metric]) for _ in range(n)])


@pytest.mark.slow  # a race between two processes: the full tier
def test_drivers_recording_launches_at_once_never_take_one_number(tmp_path):
    """Launches are numbered, one sequence per stage across its studies in one storage; taken outside the
    launch's own transaction, two drivers took the same number (about one launch in twenty here)."""
    for metric in ("a", "b"):  # the stage's two studies, "1" and "1~<digest>", in one file
        Ledger.open(tmp_path, "1", "sqlite", objective={"metric": metric})
    spawn = multiprocessing.get_context("spawn")
    barrier, numbers = spawn.Barrier(2), spawn.Manager().list()
    procs = [spawn.Process(target=record_launches, args=(str(tmp_path), m, 20, barrier, numbers)) for m in "ab"]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0, 0]
    assert sorted(numbers) == list(range(1, 41))
    launches = merged_launches(Ledger.read_all(tmp_path, "1", "sqlite"))
    assert [launch["number"] for launch in launches] == list(range(1, 41))


def test_launches_and_trials_are_ordered_by_launch_number_not_by_time(tmp_path):
    """A launch recorded by a host whose clock is behind is still the newer; an old ledger's launches (no numbers)
    read first, each study's in the order it recorded them."""
    first = Ledger.open(tmp_path, "1", "sqlite", objective={"metric": "a"})
    first.study.set_user_attr(  # as an earlier version wrote them, a clock stepped back between the two
        "launches", [{"at": f"2026-01-0{day}", "args": [f"day {day}"], "run_ids": ["r"]} for day in (3, 1)]
    )
    other = Ledger.open(tmp_path, "1", "sqlite", objective={"metric": "b"})
    grid = {"seed": IntDistribution(0, 10)}
    assert other.record_launch(["r"], ["second study"]) == 1
    earlier = other.start({"seed": 1}, grid, {"run_id": "r"})
    assert first.record_launch(["r"], ["first study again"]) == 2
    later = first.start({"seed": 1}, grid, {"run_id": "r"})
    with sqlite3.connect(tmp_path / "ledger.db") as db:  # the later trial started an hour "before" the earlier
        db.execute("UPDATE trials SET datetime_start = datetime(datetime_start, '-1 hour') WHERE trial_id = ?", (2,))
    ledgers = Ledger.read_all(tmp_path, "1", "sqlite")
    launches = merged_launches(ledgers)
    assert [launch["args"] for launch in launches] == [["day 3"], ["day 1"], ["second study"], ["first study again"]]
    assert [launch.get("number") for launch in launches] == [None, None, 1, 2]
    (trials,) = merged_attempts(ledgers).values()
    assert [t._trial_id for t in trials] == [earlier._trial_id, later._trial_id]
    assert trials[0].datetime_start > trials[1].datetime_start and trials[1].user_attrs["launch"] == 2


@pytest.mark.parametrize("first", [True, False])
def test_a_study_recorded_with_a_setting_as_typed_is_found_by_its_value(tmp_path, first):
    """A ledger of an earlier version recorded the command line's settings as typed (`trainer.lr=1e-3`); a launch
    now records them by value (`trainer.lr=0.001`): it finds that study, the stage's first or a `1~` one beside it."""
    typed = {"metric": "ppl", "passed": ["seed=42", "trainer.lr=1e-3"]}
    if not first:
        Ledger.open(tmp_path, "1", "sqlite", objective={"metric": "ppl", "passed": []})
    earlier = Ledger.open(tmp_path, "1", "sqlite", objective=typed).study.study_name
    now = Ledger.open(tmp_path, "1", "sqlite", objective={**typed, "passed": ["seed=42", "trainer.lr=0.001"]})
    assert now.study.study_name == earlier and (earlier == "1" if first else earlier.startswith("1~"))
    other = Ledger.open(tmp_path, "1", "sqlite", objective={**typed, "passed": ["seed=42", "trainer.lr=0.002"]})
    assert other.study.study_name not in ("1", earlier)  # another value: a study of its own
