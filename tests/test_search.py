"""A search stage as Optuna users expect it: a named objective, learning curves as intermediate values
(read back through optuna-dashboard's own API), and a pruner that stops a trial for good.

Two launches of one tiny search: the first samples a good learning rate and completes; the second may
sample only a hopeless one (a one-point search space), which the median pruner stops at its first
evaluation past step 0.
"""

from __future__ import annotations

import json
import re
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
from optuna.trial import TrialState
from optuna_dashboard import wsgi
from stages import sweep, trials, user_stage

from cart_sweeps.config import ConfigError
from cart_sweeps.sweep.driver import run_stage
from cart_sweeps.sweep.pool import make_pool

SEARCH = [
    "stage=lr",
    "scale=tiny",
    "sweep.sampler=tpe",
    "sweep.pruner=median",
    "sweep.startup_trials=1",
    "model.d_model=32",
    "model.n_prelude=1",
    "model.n_loops=1",
    "trainer.steps=30",
    "trainer.eval_every=5",
    "trainer.min_lr=1e-8",  # below the second trial's lr of 1e-7 (a min_lr above lr is refused)
    "launcher.slots=1",  # one trial at a time: the second is judged against the first
]


def _only_lr(lr: float) -> str:
    return f"stage.search={{trainer.lr: {{low: {lr}, high: {lr}}}}}"


@pytest.fixture(scope="module")
def searched(tmp_path_factory, data_cache):
    runs = tmp_path_factory.mktemp("search")
    first = sweep(runs, *SEARCH, "sweep.n_trials=1", _only_lr(3e-3))
    assert first.returncode == 0, first.stderr[-3000:]
    second = sweep(runs, *SEARCH, "sweep.n_trials=2", _only_lr(1e-7))
    assert second.returncode == 0, second.stderr[-3000:]
    return runs, second


def _dashboard_get(storage: str, path: str) -> dict:
    app, reply = wsgi(storage), {}
    environ = {"PATH_INFO": path}
    setup_testing_defaults(environ)
    body = b"".join(app(environ, lambda status, headers, exc_info=None: reply.update(status=status)))
    assert reply["status"] == "200 OK", body[:500]
    return json.loads(body)


@pytest.mark.slow
def test_dashboard_shows_the_named_objective_and_learning_curves(searched):
    runs, _ = searched
    storage = f"sqlite:///{runs / 'lr' / 'ledger.db'}"
    (summary,) = _dashboard_get(storage, "/api/studies")["study_summaries"]
    study = _dashboard_get(storage, f"/api/studies/{summary['study_id']}")
    assert study["objective_names"] == ["ppl_austen"]
    done = next(t for t in study["trials"] if t["state"] == "Complete")
    curve = {point["step"]: point["value"] for point in done["intermediate_values"]}
    assert sorted(curve) == [5, 10, 15, 20, 25, 30]
    assert curve[30] == done["values"][0]  # the last evaluation is the trial's value
    run_dir = next(u["value"] for u in done["user_attrs"] if u["key"] == "run_dir")
    logged = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    assert curve == {row["step"]: row["ppl_austen"] for row in logged if row["kind"] == "eval" and row["step"]}


@pytest.mark.slow
def test_a_pruned_trial_stops_and_is_never_retried(searched):
    runs, second = searched
    good, pruned = trials(runs, "lr")
    assert good.state == TrialState.COMPLETE and pruned.state == TrialState.PRUNED
    assert pruned.user_attrs["status"] == "pruned" and pruned.params["trainer.lr"] == 1e-7
    assert max(pruned.intermediate_values) < 30  # stopped before its last step
    folder = json.loads(open(f"{pruned.user_attrs['run_dir']}/summary.json").read())
    assert folder["status"] == "pruned" and folder["step"] < 30
    assert "pruned at step" in second.stderr and "1 pruned" in second.stderr
    again = sweep(runs, *SEARCH, "sweep.n_trials=2", _only_lr(1e-7))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 done, skipped" in again.stdout
    assert len(trials(runs, "lr")) == 2


def test_a_pruner_on_a_grid_is_one_line_before_anything_launches(tmp_path, monkeypatch):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    grid = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2"]
    with pytest.raises(ConfigError, match="^sweep.pruner=median prunes searches; stage 1 is a grid: drop it$"):
        run_stage([*grid, "sweep.pruner=median"], make_pool)
    assert not list(tmp_path.iterdir())


# --- samplers, repeats and the end of a search (issues 45, 48) ---

NARROW = """\
name: narrow
numbers: own
search:
  trainer.warmup_steps: {low: 1, high: 6}
recipe:
  seed: 42
  model.d_model: 32
  trainer.steps: 8
"""
NARROW_ARGS = ["stage=narrow", "scale=tiny", "sweep.sampler=tpe", "sweep.startup_trials=2"]


def _ledger(runs, stage: str) -> list:
    return [t for t in trials(runs, stage) if t.state != TrialState.WAITING]


def _folders(runs, stage: str) -> dict[str, dict]:
    """Run id -> its folder's summary.json, for every run folder of the stage."""
    found = [json.loads(p.read_text()) | {"dir": p.parent} for p in (runs / stage).glob("*/summary.json")]
    return {s["run_id"]: s for s in found}


def _trained_once(runs, stage: str) -> None:
    """No run folder's log shows a second job (a repeat trained, or two jobs racing for one folder)."""
    for log in (runs / stage).glob("*/run.log"):
        text = log.read_text()
        assert "already completed" not in text and "in use by another process" not in text, log


def _progress_follows_the_runs(output: str) -> None:
    for done, total, left in re.findall(r": (\d+)/(\d+) done, \d+ running, \d+ failed, (-?\d+) left", output):
        assert int(done) <= int(total) and int(left) >= 0, output


@pytest.mark.slow
def test_a_tpe_search_over_a_narrow_int_range_ends_each_run_trained_once(tmp_path, data_cache):
    """Issue 45/48: 6 points and sweep.n_trials=10 once ran for ever (2,000 trials in 4 minutes), its repeats racing
    for one folder, the progress at -3 left and the exit code 1. Each repeat is now a reference to its run."""
    cfg, runs = user_stage(tmp_path, NARROW), tmp_path / "runs"
    first = sweep(runs, "--config-dir", str(cfg), *NARROW_ARGS, "sweep.n_trials=5", timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    _progress_follows_the_runs(first.stderr)
    ledger, folders = _ledger(runs, "narrow"), _folders(runs, "narrow")
    assert len(ledger) == 5  # n_trials counts trials, repeats among them (6 points: none is exhausted in 5)
    own = {t.user_attrs["run_id"]: t for t in ledger if "run_id" in t.user_attrs}
    repeats = [t for t in ledger if "repeat_of" in t.user_attrs]
    assert len(own) + len(repeats) == 5 and set(own) == set(folders)  # one folder per distinct run
    for t in repeats:  # a repeat takes its run's result, and names the run
        run = own[t.user_attrs["repeat_of"]]
        assert t.params == run.params and t.values == run.values and t.state == TrialState.COMPLETE
    for run_id, t in own.items():
        assert t.state == TrialState.COMPLETE and t.values == [folders[run_id]["ppl_austen"]]
    _trained_once(runs, "narrow")
    again = sweep(runs, "--config-dir", str(cfg), *NARROW_ARGS, "sweep.n_trials=5")
    assert again.returncode == 0 and f"{len(own)} done, skipped" in again.stdout, again.stderr[-3000:]
    assert len(_ledger(runs, "narrow")) == 5 and "0 completed" in again.stderr
    more = sweep(runs, "--config-dir", str(cfg), *NARROW_ARGS, "sweep.n_trials=40", timeout=240)
    assert more.returncode == 0, more.stderr[-3000:]
    assert "every one of its search space's 6 points has been sampled, so the search ends at" in more.stdout
    _progress_follows_the_runs(more.stderr)
    folders = _folders(runs, "narrow")
    assert sorted(s["trainer"]["warmup_steps"] for s in folders.values()) == [1, 2, 3, 4, 5, 6]
    assert 6 <= len(_ledger(runs, "narrow")) < 40
    _trained_once(runs, "narrow")
    last = sweep(runs, "--config-dir", str(cfg), *NARROW_ARGS, "sweep.n_trials=40")  # exhausted: asks nothing
    assert last.returncode == 0 and len(_ledger(runs, "narrow")) == len(trials(runs, "narrow"))
    assert "6 done, skipped" in last.stdout and "0 completed" in last.stderr
    table = _table(tmp_path, runs, "narrow")  # each run once, its own trial, its own value
    assert len(table) == 6
    own = {t.user_attrs["run_id"]: t for t in _ledger(runs, "narrow") if "run_id" in t.user_attrs}
    by_warmup = {s["trainer"]["warmup_steps"]: s for s in folders.values()}
    for row in table.to_dict("records"):
        summary = by_warmup[row["warmup_steps"]]
        assert row["ppl_austen"] == pytest.approx(summary["ppl_austen"])
        assert row["trial"] == own[summary["run_id"]].number
    _a_raced_attempt_lends_no_trial_its_value(tmp_path, runs, own)


def _a_raced_attempt_lends_no_trial_its_value(tmp_path, runs, own: dict) -> None:
    """A ledger of an earlier version holds a run's repeat as a second attempt, rejected (it raced the first for
    the folder): the run's row still names the trial that recorded its result."""
    run_id, done = next(iter(own.items()))
    study = optuna.load_study(study_name="narrow", storage=f"sqlite:///{runs / 'narrow' / 'ledger.db'}")
    attrs = {**done.user_attrs, "status": "rejected", "error": "in use by another process"}
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.FAIL, params=done.params, distributions=done.distributions, user_attrs=attrs
        )
    )
    (row,) = [
        r
        for r in _table(tmp_path, runs, "narrow").to_dict("records")
        if r["trial"] in (done.number, len(study.trials) - 1)
    ]
    assert row["trial"] == done.number and row["ppl_austen"] == pytest.approx(done.values[0])


def _table(tmp_path, runs, stage: str):
    import shutil

    import pandas as pd
    from test_axes import analysis

    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    analysis(runs, tmp_path / "out")
    return pd.read_csv(tmp_path / "out" / f"runs_{stage}.csv")


SMALL = """\
name: small
numbers: own
search:
  trainer.warmup_steps: {low: 1, high: 3}
  trainer.lr: {low: 1.0e-3, high: 3.0e-3, log: true}
recipe:
  seed: 42
  model.d_model: 32
  trainer.steps: 4
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sampler", "extra"),
    [
        ("random", []),
        ("gp", []),
        ("cmaes", []),
        ("nsga2", []),
        ("qmc", []),
        ("nsga2", ["sweep.metrics=[ppl_austen,tokens_per_s]"]),
    ],
)
def test_each_sampler_runs_a_small_search_seeded_by_the_stage(tmp_path, data_cache, sampler, extra):
    cfg, runs = user_stage(tmp_path, SMALL), tmp_path / "runs"
    args = ["--config-dir", str(cfg), "stage=small", "scale=tiny", f"sweep.sampler={sampler}", *extra]
    done = sweep(runs, *args, "sweep.n_trials=3", "sweep.startup_trials=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning" not in done.stderr.lower(), done.stderr[-3000:]  # no Optuna fallback to random sampling
    ledger = _ledger(runs, "small")
    assert len(ledger) == 3 and all(t.state == TrialState.COMPLETE for t in ledger)
    assert len(ledger[0].values) == (2 if extra else 1)
    for t in ledger:
        assert 1 <= t.params["trainer.warmup_steps"] <= 3 and 1e-3 <= t.params["trainer.lr"] <= 3e-3
    _trained_once(runs, "small")
    study = optuna.load_study(study_name="small", storage=f"sqlite:///{runs / 'small' / 'ledger.db'}")
    from cart_sweeps.sweep.samplers import make_sampler

    twin = optuna.create_study(sampler=make_sampler(sampler, 42, 1), directions=study.directions)  # the seed: 42
    first = twin.ask()
    assert first.suggest_int("trainer.warmup_steps", 1, 3) == ledger[0].params["trainer.warmup_steps"]
    assert first.suggest_float("trainer.lr", 1e-3, 3e-3, log=True) == ledger[0].params["trainer.lr"]


CHOOSE = """\
name: choose
numbers: own
search:
  model.n_loops: {low: 2, high: 3, when: {model: cart}}
  model: {choices: [cart, dense]}
  trainer.lr: {low: 1.0e-3, high: 3.0e-3, log: true}
recipe:
  seed: 42
  model.d_model: 32
  trainer.steps: 8
"""


@pytest.mark.slow
def test_a_conditional_declared_above_its_categorical_is_sampled(tmp_path, data_cache):
    cfg, runs = user_stage(tmp_path, CHOOSE), tmp_path / "runs"
    done = sweep(
        runs, "--config-dir", str(cfg), "stage=choose", "scale=tiny", "sweep.sampler=random", "sweep.n_trials=4"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = _ledger(runs, "choose")
    assert {t.params["model"] for t in ledger} == {"cart", "dense"}  # seed 42 draws both
    for t in ledger:
        assert ("model.n_loops" in t.params) == (t.params["model"] == "cart"), t.params


@pytest.mark.slow
def test_hydra_s_basic_sweeper_without_a_stage_runs_the_ad_hoc_multirun(tmp_path, data_cache):
    done = sweep(tmp_path, "hydra/sweeper=basic", "scale=tiny", "seed=1,2", "trainer.steps=4", "model.d_model=32")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hydra/sweeper=basic: this multirun runs the same runs through the cart_sweeps sweeper" in done.stderr
    (stage,) = [p for p in tmp_path.iterdir() if p.name.startswith("adhoc-")]
    assert sorted(s["seed"] for s in _folders(tmp_path, stage.name).values()) == [1, 2]


_CATEGORICAL = "search={trainer.lr: {low: 1.0e-3, high: 3.0e-3}, model: {choices: [cart, dense]}}"
_CONDITIONAL = (
    "search={model: {choices: [cart, dense]}, model.n_loops: {low: 2, high: 3, when: {model: cart}}, "
    "trainer.lr: {low: 1.0e-3, high: 3.0e-3}}"
)
_NUMERIC = "search={trainer.lr: {low: 1.0e-3, high: 3.0e-3}, trainer.warmup_steps: {low: 1, high: 3}}"


@pytest.mark.slow  # each composes the stage (over 3 s of the fast tier together)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["sweep.sampler=cmaes", f"++stage.{_CATEGORICAL}"],
            "sweep.sampler=cmaes cannot sample a categorical parameter (stage.search.model, stage lr): Optuna would "
            "draw it at random; use sweep.sampler=tpe|random|gp|nsga2|qmc, or change the space",
        ),
        (
            ["sweep.sampler=gp", f"++stage.{_CONDITIONAL}"],
            "sweep.sampler=gp cannot sample a conditional parameter (stage.search.model.n_loops, stage lr): Optuna "
            "would draw it at random; use sweep.sampler=tpe|random, or change the space",
        ),
        (["sweep.sampler=qmc", f"++stage.{_CONDITIONAL}"], "sweep.sampler=qmc cannot sample a conditional parameter"),
        (["sweep.sampler=nsga2", f"++stage.{_CONDITIONAL}"], "sweep.sampler=nsga2 cannot sample a conditional"),
        (["sweep.sampler=cmaes", f"++stage.{_CONDITIONAL}"], "sweep.sampler=cmaes cannot sample a categorical"),
        (
            ["sweep.sampler=cmaes", f"++stage.{_NUMERIC}", "sweep.metrics=[ppl_austen,tokens_per_s]"],
            "sweep.sampler=cmaes cannot sample several objectives (sweep.metrics=[ppl_austen,tokens_per_s], stage lr)",
        ),
        (
            ["sweep.sampler=random", "seed=1,2"],
            "stage lr is a search (sweep.sampler=random): it samples stage.search, not a grid, so seed would take "
            "none of its values",
        ),
        (["sweep.sampler=grid"], "stage lr is a search: add sweep.sampler=tpe sweep.n_trials=N (or another sampler: "),
        (["sweep.sampler=random", "sweep.n_trials=0"], "sweep.sampler=random needs a stage with a search space"),
    ],
)
def test_a_space_its_sampler_cannot_sample_is_one_line_before_anything_launches(tmp_path, monkeypatch, args, says):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    n_trials = [] if any(a.startswith("sweep.n_trials") for a in args) else ["sweep.n_trials=3"]
    with pytest.raises(ConfigError) as refused:
        run_stage(["stage=lr", "scale=tiny", *n_trials, *args], make_pool)
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    assert not list(tmp_path.iterdir())


def test_a_search_sampler_on_a_grid_stage_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    grid = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2"]
    with pytest.raises(
        ConfigError,
        match="^sweep.sampler=nsga2 needs a stage with a search space and sweep.n_trials=N; stage 1 has none$",
    ):
        run_stage([*grid, "sweep.sampler=nsga2", "sweep.n_trials=2"], make_pool)
    assert not list(tmp_path.iterdir())


def test_a_search_that_only_repeats_or_has_sampled_every_point_stops_asking_in_one_line():
    from cart_sweeps.sweep.search_trials import MAX_REPEATS, SearchTrials
    from cart_sweeps.sweep.space import parse

    said: list[str] = []
    endless = SearchTrials("s", parse({"trainer.lr": {"low": 1e-3, "high": 3e-3}}), 1000, {}, [], said.append)
    endless.sampled({"trainer.lr": 2e-3}, repeat=False)
    for _ in range(MAX_REPEATS):
        assert endless.may_ask()
        endless.sampled({"trainer.lr": 2e-3}, repeat=True)
    assert not endless.may_ask() and not endless.may_ask() and endless.new_runs_left() == 0
    assert said == [
        f"stage s: the sampler repeated runs the ledger holds for {MAX_REPEATS} trials in a row, so the search ends "
        f"at {MAX_REPEATS + 1} of sweep.n_trials=1000 trials (a relaunch asks again)"
    ]
    said.clear()
    space = parse(
        {"model.n_loops": {"low": 2, "high": 3, "when": {"model": "cart"}}, "model": {"choices": ["cart", "dense"]}}
    )
    assert space.size() == 3 and list(space.dists) == ["model", "model.n_loops"]
    finite = SearchTrials("s", space, 10, {}, [], said.append)
    for params in ({"model": "dense"}, {"model": "cart", "model.n_loops": 2}, {"model": "dense"}):
        assert finite.may_ask()
        finite.sampled(params, repeat=params == {"model": "dense"} and finite.trials > 0)
    assert finite.new_runs_left() == 1 and finite.may_ask()
    finite.sampled({"model": "cart", "model.n_loops": 3}, repeat=False)
    assert not finite.may_ask() and said == [
        "stage s: every one of its search space's 3 points has been sampled, so the search ends at 4 of "
        "sweep.n_trials=10 trials (another trial could only repeat a run)"
    ]
