"""A search stage as Optuna users expect it: a named objective, learning curves as intermediate values
(read back through optuna-dashboard's own API), and a pruner that stops a trial for good.

Two launches of one tiny search: the first samples a good learning rate and completes; the second may
sample only a hopeless one (a one-point search space), which the median pruner stops at its first
evaluation past step 0.
"""

from __future__ import annotations

import json
from wsgiref.util import setup_testing_defaults

import pytest
from optuna.trial import TrialState
from optuna_dashboard import wsgi
from stages import sweep, trials

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
