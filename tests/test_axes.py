"""Any config key is an axis, and every reader of results sees the same run set.

Real commands on real tiny stages: a user's own stage (`--config-dir`) over trainer.lr x model.n_loops, a
TPE search, relaunches that narrow, copy, change the metric or the recipe; then `plan`, the analysis and
stage 2's zoom read them. Roles are checked across every config source.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from io import StringIO
from pathlib import Path

import optuna
import pandas as pd
import pytest
from stages import env, sweep

from cart_sweeps.analysis.__main__ import main as analysis_main
from cart_sweeps.compose import compose_config
from cart_sweeps.dashboard import stage_tables
from cart_sweeps.sweep.expand import Stage

REPO = Path(__file__).parents[1]
TINY = ["scale=tiny", "trainer.steps=4"]
MINE = """\
name: mine
grid:
  trainer.lr: [1.0e-3, 3.0e-3]
  model.n_loops: [2, 4]
recipe:
  seed: 42
  model.d_model: 256
  model.n_prelude: 2
  trainer.steps: 3000
"""


def command(runs: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env(runs), capture_output=True, text=True, cwd=REPO
    )


def analysis(runs: Path, out: Path) -> dict:
    """The analysis of `runs`: its findings (each stage's own table lands in out/runs_<stage>.csv). In process:
    the same main() `python -m cart_sweeps.analysis` runs, without a fresh interpreter's imports each time (the
    command itself is run as a subprocess by tests/test_readme.py and tests/test_generated.py)."""
    assert analysis_main(["--runs", str(runs), "--out", str(out)]) == 0
    return json.loads((out / "findings.json").read_text())


def studies(runs: Path, stage: str) -> dict[str, optuna.Study]:
    storage = f"sqlite:///{runs / stage / 'ledger.db'}"
    return {n: optuna.load_study(study_name=n, storage=storage) for n in optuna.get_all_study_names(storage)}


@pytest.fixture(scope="module")
def mine(tmp_path_factory, data_cache) -> tuple[Path, Path]:
    """The user's stage `mine` (its own folder), launched once: 4 runs."""
    base = tmp_path_factory.mktemp("axes")
    (base / "cfg" / "stage").mkdir(parents=True)
    (base / "cfg" / "stage" / "mine.yaml").write_text(MINE)
    runs = base / "runs"
    done = sweep(runs, "--config-dir", str(base / "cfg"), "stage=mine", *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    return base / "cfg", runs


@pytest.mark.slow
def test_every_key_a_stage_varies_names_its_runs_and_is_tabled(mine, tmp_path):
    cfg, runs = mine
    labels = sorted(p.name.rsplit("-", 1)[0] for p in (runs / "mine").glob("d*"))
    assert labels == ["d32-P2-R2-lr1e-3-s42", "d32-P2-R2-lr3e-3-s42", "d32-P2-R4-lr1e-3-s42", "d32-P2-R4-lr3e-3-s42"]
    plan = command(runs, "cart_sweeps.plan", "--config-dir", str(cfg), "stage=mine", *TINY, "plan.format=csv")
    assert plan.returncode == 0, plan.stderr
    planned = pd.read_csv(StringIO(plan.stdout))
    assert sorted(planned["trainer.lr"]) == [1e-3, 1e-3, 3e-3, 3e-3] and set(planned["status"]) == {"completed"}
    findings = analysis(runs, tmp_path)
    table = pd.read_csv(tmp_path / "runs_mine.csv")
    assert sorted(zip(table["lr"], table["R"], strict=True)) == [(1e-3, 2), (1e-3, 4), (3e-3, 2), (3e-3, 4)]
    assert table["ppl_austen"].is_monotonic_increasing  # best first
    assert findings["selection"]["mine"]["runs"] == 4 and findings["stages"]["mine"]["lr"] == table["lr"][0]
    summaries = [json.loads(p.read_text()) for p in (runs / "mine").glob("*/summary.json")]
    assert sorted(s["label"] for s in summaries) == labels  # the run's own record names it as the folder does
    dashboard = command(runs, "cart_sweeps.dashboard", "--config-dir", str(cfg), "stage=mine", *TINY)
    assert dashboard.returncode == 0 and "the stage's tables: runs_mine" in dashboard.stdout, dashboard.stderr
    assert "grouped by trainer.lr, model.n_loops" in dashboard.stdout


@pytest.mark.slow
def test_a_narrowed_relaunch_and_a_copy_change_nothing_tabled(mine, tmp_path):
    cfg, runs = mine
    before = analysis(runs, tmp_path / "before")
    done = sweep(runs, "--config-dir", str(cfg), "stage=mine", *TINY, "model.n_loops=2")
    assert done.returncode == 0 and "2 done, skipped" in done.stdout, done.stdout + done.stderr
    run = next((runs / "mine").glob("d32-P2-R2-lr1e-3-*"))
    shutil.copytree(run, run.with_name(run.name + ".bak"), symlinks=True)
    after = analysis(runs, tmp_path / "after")
    same = pd.read_csv(tmp_path / "before" / "runs_mine.csv")
    pd.testing.assert_frame_equal(same, pd.read_csv(tmp_path / "after" / "runs_mine.csv"))
    assert after["selection"]["mine"]["runs"] == before["selection"]["mine"]["runs"] == 4
    copies = [e for e in after["selection"]["mine"]["excluded"] if e["run"].endswith(".bak")]
    assert len(copies) == 1 and copies[0]["reason"].startswith("a copy of d32-P2-R2-lr1e-3-s42")
    shutil.rmtree(run.with_name(run.name + ".bak"))


@pytest.mark.slow
def test_a_metric_change_starts_a_study_of_its_own_and_leaves_the_first_untouched(mine):
    cfg, runs = mine
    first = {t.number: t.value for t in studies(runs, "mine")["mine"].trials}
    done = sweep(runs, "--config-dir", str(cfg), "stage=mine", *TINY, "sweep.metric=ppl_bible")
    assert done.returncode == 0 and "a study of its own" in done.stdout, done.stdout + done.stderr
    found = studies(runs, "mine")
    assert {t.number: t.value for t in found["mine"].trials} == first and found["mine"].metric_names == ["ppl_austen"]
    (other,) = (s for n, s in found.items() if n != "mine")
    assert other.metric_names == ["ppl_bible"] and len(other.trials) == 4
    for trial in other.trials:
        summary = json.loads((runs / "mine" / Path(trial.user_attrs["run_dir"]).name / "summary.json").read_text())
        assert trial.value == summary["ppl_bible"]


@pytest.mark.slow
def test_a_search_is_tabled_trial_by_trial_best_first(tmp_path, data_cache):
    runs = tmp_path / "runs"
    done = sweep(runs, "stage=lr", *TINY, "sweep.sampler=tpe", "sweep.n_trials=3", "sweep.startup_trials=1")
    assert done.returncode == 0, done.stderr[-3000:]
    analysis(runs, tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "runs_lr.csv")
    best = studies(runs, "lr")["lr"].best_trial
    assert (
        len(table) == 3
        and table["trial"][0] == best.number
        and table["lr"][0] == pytest.approx(best.params["trainer.lr"])
    )
    assert len({p.name.rsplit("-", 1)[0] for p in (runs / "lr").glob("d*")}) == 3  # lr in every label


def newest_values(runs: Path, lr: float) -> dict[int, float]:
    """Each R's ppl_austen, read by hand from the summaries of the stage-1 run folders trained at `lr`."""
    summaries = [json.loads(p.read_text()) for p in (runs / "1").glob("*/summary.json")]
    return {s["model"]["n_loops"]: s["ppl_austen"] for s in summaries if s["trainer"]["lr"] == lr}


@pytest.mark.slow
def test_zoom_promotes_from_the_runs_the_analysis_tables(tmp_path, data_cache):
    """Launch 1 screens R=2 and R=4; launch 2 re-runs both at a learning rate too small to learn. The ledger's
    best value is a superseded run of launch 1; the run set's best cell, for zoom and the analysis alike, is
    launch 2's best, read by hand from its run folders. Launch 3 then re-runs one cell with another recipe:
    zoom refuses to rank the mix in one line, and the analysis tables the recipes apart."""
    runs = tmp_path / "runs"
    screen = ["stage=1", *TINY, "model.d_model=256", "model.n_prelude=2", "model.n_loops=2,4"]
    assert sweep(runs, *screen, "trainer.lr=3e-2", "trainer.min_lr=3e-2").returncode == 0
    ledger_best = studies(runs, "1")["1"].best_trial
    assert sweep(runs, *screen, "trainer.lr=1e-6", "trainer.min_lr=1e-6").returncode == 0
    values = newest_values(runs, 1e-6)
    expected = min(values, key=values.__getitem__)
    trials = [t for s in studies(runs, "1").values() for t in s.trials if t.value is not None]
    assert min(trials, key=lambda t: t.value).number == ledger_best.number  # still the ledger's best value
    assert expected != ledger_best.params["model.n_loops"]  # so zoom from the ledger would pick another R
    findings = analysis(runs, tmp_path / "out")
    assert findings["stages"]["1"]["R"] == expected
    assert findings["stages"]["1"]["ppl_austen"] == pytest.approx(values[expected])
    superseded = [e for e in findings["selection"]["1"]["excluded"] if e["reason"].startswith("superseded")]
    assert [e["differs"] for e in superseded] == [["trainer.lr 0.03 -> 1e-06", "trainer.min_lr 0.03 -> 1e-06"]] * 2
    args = ["stage=2", *TINY, "stage.select=zoom", "model.d_model=256", "seed=42", "plan.format=csv"]
    plan = command(runs, "cart_sweeps.plan", *args)
    assert plan.returncode == 0, plan.stderr
    zoomed = pd.read_csv(StringIO(plan.stdout))
    cross = {2: [2, 4], 4: [2, 4, 6]}[expected]  # R and its neighbours in the grid {2, 4}, past its top edge by 2
    assert sorted(zip(zoomed["model.n_loops"], zoomed["model.n_prelude"], strict=True)) == [(r, 2) for r in cross]

    relaunch = [*screen[:-1], f"model.n_loops={expected}", "trainer.lr=1e-3", "trainer.min_lr=1e-6"]
    assert sweep(runs, *relaunch).returncode == 0
    plan = command(runs, "cart_sweeps.plan", *args)
    assert plan.returncode == 2 and plan.stderr.count("\n") == 1 and "Traceback" not in plan.stderr
    assert "stage.select=zoom: stage 1's runs at d=256 mix recipes (trainer.lr 0.001, 1e-06)" in plan.stderr
    findings = analysis(runs, tmp_path / "out")
    assert "1" not in findings["stages"]  # no best across two recipes
    assert {d["cell"]["lr"] for d in findings["decisions"] if d["claim"] == "best_R"} == {1e-3, 1e-6}
    grid = stage_tables(compose_config(["stage=1", "scale=tiny", f"paths.runs={runs}"]))["stage1_grid"]
    written = pd.read_csv(tmp_path / "out" / "stage1_grid.csv")
    assert sorted(grid["lr"]) == [1e-6, 1e-3]  # the dashboard's table: a row per recipe, as the analysis wrote it
    pd.testing.assert_frame_equal(grid[written.columns].reset_index(drop=True), written, check_dtype=False)


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize(
    ("file", "refused", "says"),
    [
        (
            "name: mine\nrole: screen\ngrid: {seed: [1, 2]}\n",
            ["mine", "1"],
            r"stages 1 \(.*sweeps/1.yaml\) and mine \(.*stage/mine.yaml\) both claim role: screen; a role is one "
            r"stage's: remove `role:` from one of them",
        ),
        (
            "name: mine\nrole: scren\ngrid: {seed: [1, 2]}\n",
            ["mine"],
            r".*stage/mine.yaml: role: scren is no role of the study; use one of screen, confirm, parity, ablations, "
            r"variable_r, benchmarks, or leave role out",
        ),
    ],
)
def test_a_taken_or_unknown_role_is_one_line(tmp_path, file, refused, says):
    """Refused for the stages it concerns (the stage claiming it, the stage it takes the role from); another
    stage's command reads no role but its own, and runs."""
    (tmp_path / "cfg" / "stage").mkdir(parents=True)
    (tmp_path / "cfg" / "stage" / "mine.yaml").write_text(file)
    folder = str(tmp_path / "cfg")
    for module, stage in [*(("cart_sweeps.plan", s) for s in refused), ("cart_sweeps", "mine")]:
        done = command(tmp_path / "runs", module, "--config-dir", folder, f"stage={stage}", "scale=tiny")
        assert done.returncode == 2 and done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert re.fullmatch(f"error: {says}", line), line
    other = command(tmp_path / "runs", "cart_sweeps.plan", "--config-dir", folder, "stage=2", "scale=tiny")
    assert other.returncode == 0 and other.stderr == "", other.stderr


@pytest.mark.slow
def test_the_analysis_reads_the_ledger_of_the_storage_the_stage_uses_now(mine, tmp_path):
    """After sweep.storage=journal, the new runs are in the journal alone: read from the stale SQLite
    ledger they would be "started by hand"."""
    cfg, runs = mine
    done = sweep(runs, "--config-dir", str(cfg), "stage=mine", *TINY, "model.n_loops=2,6", "sweep.storage=journal")
    assert done.returncode == 0, done.stderr[-3000:]
    findings = analysis(runs, tmp_path)
    assert findings["selection"]["mine"]["runs"] == 6
    assert not [e for e in findings["selection"]["mine"]["excluded"] if "by hand" in e["reason"]]
    assert sorted(pd.read_csv(tmp_path / "runs_mine.csv")["R"]) == [2, 2, 4, 4, 6, 6]


def test_a_launch_s_objective_is_its_metric_and_recipe_not_where_or_which_cells():
    """What a ledger study's values mean: a new metric or recipe is a new objective (a study of its own);
    narrowing an axis, the launcher or a setting of how fast a run goes is not."""
    base = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_prelude=2"]
    objective = Stage(base).objective()
    assert Stage([*base, "model.n_loops=8", "launcher.slots=4", "trainer.log_every=5"]).objective() == objective
    assert Stage([*base, "trainer.steps=20"]).objective() != objective
    assert Stage([*base, "sweep.metric=ppl_bible"]).objective() != objective
    assert Stage(["stage=1", "model.d_model=256", "model.n_prelude=2"]).objective() != objective  # scale=paper


def test_a_setting_s_value_not_its_spelling_is_its_objective(monkeypatch):
    """`trainer.lr=1e-3` and `trainer.lr=0.001` (or an interpolation that resolves to it) are one objective, one
    study; the canonical spelling (as format_value writes it) is recorded as before, so its digest is unchanged."""
    base = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_prelude=2"]
    canonical = Stage([*base, "trainer.lr=0.001", "trainer.decay_all=false"]).objective()
    assert canonical["passed"] == ["trainer.decay_all=false", "trainer.lr=0.001"]
    monkeypatch.setenv("CART_SWEEPS_TEST_LR", "1e-3")
    for spelled in ("1e-3", "1.0e-3", "${oc.env:CART_SWEEPS_TEST_LR}"):
        assert Stage([*base, f"trainer.lr={spelled}", "trainer.decay_all=False"]).objective() == canonical
    assert Stage([*base, "trainer.lr=0.003", "trainer.decay_all=false"]).objective() != canonical


@pytest.mark.parametrize(
    "restated", [["trainer.min_lr=0.0003"], ["trainer.betas=[0.90,0.950]"], ["trainer.lr=3.0e-3", "seed=42"]]
)
def test_a_value_restated_as_the_runs_have_it_is_the_same_objective(restated):
    """Each opened a study of its own for the same runs (issue 48, item 10): a setting is part of what a study
    means only where it changes the value its key has without it (tiny's min_lr 3e-4, betas [0.9, 0.95], lr 3e-3)."""
    base = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_prelude=2"]
    assert Stage([*base, *restated]).objective() == Stage(base).objective()
    assert Stage([*base, "model=dense", *restated]).objective() != Stage(base).objective()


BETAS = "trainer.betas=[0.9,0.95],[0.9,0.99]"
BETAS_GRID = ["stage=1", *TINY, "model.d_model=256", "model.n_prelude=2", "model.n_loops=2", BETAS]


def test_a_list_valued_axis_is_text_in_params_and_labels_without_spaces(tmp_path):
    """A list per run (or a dict) is an axis like any other: its params hold it as override text (hashable, a
    choice Optuna stores), its runs get it as a list, its labels write it without spaces; `plan` lists them."""
    stage = Stage(BETAS_GRID)
    assert [r.params["trainer.betas"] for r in stage.runs] == ["[0.9,0.95]", "[0.9,0.99]"]
    assert [list(r.config.cfg.trainer.betas) for r in stage.runs] == [[0.9, 0.95], [0.9, 0.99]]
    assert [r.label for r in stage.runs] == ["d32-P2-R2-betas0.9_0.95-s42", "d32-P2-R2-betas0.9_0.99-s42"]
    assert stage.dists(stage.runs[0].params)["trainer.betas"].choices == ("[0.9,0.95]", "[0.9,0.99]")
    quoted = Stage([*BETAS_GRID[:-1], "model.core_update='paper','reference'"])  # was Hydra's QuotedString's repr
    assert [r.params["model.core_update"] for r in quoted.runs] == ["paper", "reference"]
    plan = command(tmp_path, "cart_sweeps.plan", *BETAS_GRID, "plan.format=csv")
    assert plan.returncode == 0, plan.stderr
    assert sorted(pd.read_csv(StringIO(plan.stdout))["label"]) == [r.label for r in stage.runs]


def old_ledger(ledger: Path) -> None:
    """Rewrite a ledger's list-valued params as a version before them recorded them: Optuna's choices as lists."""
    with sqlite3.connect(ledger) as db:
        for row_id, dist in db.execute("SELECT param_id, distribution_json FROM trial_params").fetchall():
            found = json.loads(dist)
            choices = found["attributes"].get("choices", [])
            if any(isinstance(c, str) and c.startswith("[") for c in choices):
                found["attributes"]["choices"] = [json.loads(c) for c in choices]
                db.execute(
                    "UPDATE trial_params SET distribution_json = ? WHERE param_id = ?", (json.dumps(found), row_id)
                )


@pytest.mark.slow
def test_a_list_valued_axis_trains_plans_and_is_tabled_as_is_the_rest_of_its_root(tmp_path, data_cache):
    """`trainer.betas=[...],[...]` trained, then every plan and analysis of the runs root failed (unhashable
    type: 'list'). Its stage, and another beside it, plan and are tabled; so they are from a ledger that holds
    the lists as the version before this one recorded them."""
    runs = tmp_path / "runs"
    assert sweep(runs, *BETAS_GRID).returncode == 0
    other = ["stage=2", *TINY, "model.d_model=256", "model.n_loops=6", "seed=42"]
    assert sweep(runs, *other).returncode == 0
    for rewritten in (False, True):
        if rewritten:
            old_ledger(runs / "1" / "ledger.db")
            assert isinstance(studies(runs, "1")["1"].trials[0].params["trainer.betas"], list)
        for args in (BETAS_GRID, other):
            plan = command(runs, "cart_sweeps.plan", *args, "plan.format=csv")
            assert plan.returncode == 0 and set(pd.read_csv(StringIO(plan.stdout))["status"]) == {"completed"}, (
                plan.stderr
            )
        findings = analysis(runs, tmp_path / f"out{rewritten}")
        table = pd.read_csv(tmp_path / f"out{rewritten}" / "runs_1.csv")
        assert sorted(table["betas"]) == ["[0.9,0.95]", "[0.9,0.99]"] and findings["selection"]["2"]["runs"] == 1


@pytest.mark.slow
def test_two_spellings_of_a_value_record_in_one_study(tmp_path, data_cache):
    """A relaunch spelling trainer.lr another way, or restating values its runs have, is the same objective: its
    runs done, no study of its own; a study an earlier version recorded with the setting as typed is found too."""
    runs = tmp_path / "runs"
    grid = ["stage=1", *TINY, "model.d_model=256", "model.n_prelude=2", "model.n_loops=2"]
    assert sweep(runs, *grid, "trainer.lr=1e-3").returncode == 0
    study = studies(runs, "1")["1"]
    objective = study.user_attrs["objective"]
    assert "trainer.lr=0.001" in objective["passed"]
    as_typed = [line.replace("trainer.lr=0.001", "trainer.lr=1e-3") for line in objective["passed"]]
    study.set_user_attr("objective", {**objective, "passed": as_typed})  # as the version before this one wrote it
    for spelled in ("0.001", "1.0e-3 trainer.min_lr=0.0003 trainer.betas=[0.90,0.950]"):  # the last restates two
        done = sweep(runs, *grid, *f"trainer.lr={spelled}".split())
        assert done.returncode == 0 and "1 done, skipped" in done.stdout, done.stdout + done.stderr
        assert "a study of its own" not in done.stdout and list(studies(runs, "1")) == ["1"]


@pytest.mark.slow
def test_a_multirun_without_a_stage_runs_as_an_anonymous_stage_over_the_swept_keys(tmp_path, data_cache):
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "cart_sweeps", "-m", *TINY, "model.n_loops=2,4", "launcher.slots=2"],
        env=env(runs),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (stage,) = [p.name for p in runs.iterdir() if not p.name.startswith(".")]  # beside the runs' claims (.claims)
    assert re.fullmatch(r"adhoc-[0-9a-f]{8}", stage) and (runs / stage / "ledger.db").is_file()
    analysis(runs, tmp_path / "out")
    assert sorted(pd.read_csv(tmp_path / "out" / f"runs_{stage}.csv")["R"]) == [2, 4]
    again = command(runs, "cart_sweeps", "-m", *TINY, "model.n_loops=2,4", "launcher.slots=2")
    assert again.returncode == 0 and "2 done, skipped" in again.stdout  # the same keys: the same stage


def test_a_multirun_that_sweeps_nothing_is_one_line(tmp_path):
    done = command(tmp_path / "runs", "cart_sweeps", "-m", "scale=tiny", "trainer.steps=4")
    assert done.returncode == 2 and done.stderr == (
        "error: a multirun sweeps some key (model.n_loops=2,4) or runs a stage (stage=<name>); "
        "without either, drop -m to train one run\n"
    )


@pytest.mark.slow
def test_stages_may_share_one_storage_one_study_each(tmp_path, data_cache):
    """sweep.storage=<file>.db: one SQLite file for the whole study (optuna-dashboard shows every stage), a
    study per stage; plan and the analysis read each stage's runs from it."""
    runs, shared = tmp_path / "runs", tmp_path / "study.db"
    screen = ["stage=1", *TINY, "model.d_model=256", "model.n_prelude=2", "model.n_loops=2,4"]
    assert sweep(runs, *screen, f"sweep.storage={shared}").returncode == 0
    assert sweep(runs, "stage=parity", *TINY, "seed=42", f"sweep.storage={shared}").returncode == 0
    assert optuna.get_all_study_names(f"sqlite:///{shared}") == ["1", "parity"]
    assert not list(runs.rglob("ledger.db"))
    plan = command(runs, "cart_sweeps.plan", *screen, f"sweep.storage={shared}", "plan.format=csv")
    assert set(pd.read_csv(StringIO(plan.stdout))["status"]) == {"completed"}, plan.stderr
    findings = analysis(runs, tmp_path / "out")
    assert findings["selection"]["1"]["runs"] == 2 and findings["selection"]["parity"]["runs"] == 3
    bad = command(runs, "cart_sweeps", *screen, "sweep.storage=ledger")
    assert bad.returncode == 2 and bad.stderr.startswith("error: sweep.storage=ledger: use sqlite or journal")
