"""A run is trained once: a stage whose run (same run id) another stage already trained references that
stage's folder instead of training it again (Stage 2's d96-P6-R6-s42 is also parity's and the ablations'
CART base), through the real commands on narrowed tiny stages."""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import pytest
from stages import sweep, trials

from cart_sweeps import plan
from cart_sweeps.analysis.load import load_runs
from cart_sweeps.stagerecord.runset import stage_runs
from cart_sweeps.sweep.expand import Stage

pytestmark = pytest.mark.slow  # real stages launched and relaunched (~40 s): the full tier (make test-full)

STEPS = ["scale=tiny", "trainer.steps=2"]  # the same recipe in both stages: the same run ids
STAGE2 = ["stage=2", *STEPS, "model.d_model=1024", "model.n_loops=6", "seed=42"]
PARITY = ["stage=parity", *STEPS, "seed=42"]
SHARED = "d96-P6-R6-s42"


def launch(runs: Path, *args: str) -> str:
    """The stage's output: its lines (stdout), then its progress and closing summary (stderr)."""
    done = sweep(runs, *args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def folders(runs: Path, stage: str) -> list[str]:
    return sorted(p.name for p in (runs / stage).iterdir() if (p / "summary.json").exists())


def plan_rows(runs: Path, monkeypatch, capsys, *args: str) -> dict[str, dict[str, str]]:
    """label -> row of `plan`'s CSV."""
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(runs))
    plan.main([*args, "plan.format=csv"])
    return {row["label"]: row for row in csv.DictReader(io.StringIO(capsys.readouterr().out))}


@pytest.fixture(scope="module")
def shared(tmp_path_factory, data_cache) -> tuple[Path, str]:
    """Stage 2 narrowed to one run, then parity narrowed to its seed 42: (runs root, parity's first output)."""
    runs = tmp_path_factory.mktemp("shared")
    launch(runs, *STAGE2)
    return runs, launch(runs, *PARITY)


def test_parity_trains_only_its_dense_runs_and_references_stage_2s(shared):
    runs, out = shared
    owner = runs / "2" / folders(runs, "2")[0]
    assert "stage parity: 3 runs; 1 done, skipped" in out and "2 completed, 0 failed" in out
    assert f"1 run done in another stage, referenced, not trained again: {SHARED} ({owner})" in out
    assert [name.rsplit("-", 1)[0] for name in folders(runs, "parity")] == ["dense-d96-L12-s42", "dense-d96-L7-s42"]
    (trial,) = [t for t in trials(runs, "parity") if t.user_attrs["label"] == SHARED]
    assert (trial.user_attrs["run_dir"], trial.user_attrs["owner"]) == (str(owner), "2")
    assert trial.value == next(t.value for t in trials(runs, "2"))
    used = {run.label: run.folder for run in stage_runs(runs, "parity").used}
    assert len(used) == 3 and used[SHARED] == owner


def test_plan_shows_the_shared_run_done_in_stage_2_and_costs_nothing_for_it(shared, monkeypatch, capsys):
    runs, _ = shared
    rows = plan_rows(runs, monkeypatch, capsys, *PARITY)
    assert {label: row["status"] for label, row in rows.items()} == {
        SHARED: "completed (stage 2)",
        "dense-d96-L7-s42": "completed",
        "dense-d96-L12-s42": "completed",
    }
    charged = plan.charged(plan.rows(Stage(PARITY)))
    assert sorted(r["label"] for r in charged) == ["dense-d96-L12-s42", "dense-d96-L7-s42"]
    plan.main(PARITY)
    assert "(1 run another stage trained left out)" in capsys.readouterr().out


def test_plan_before_parity_ever_launched_shows_it_done_in_stage_2(tmp_path, shared, monkeypatch, capsys):
    runs, _ = shared
    shutil.copytree(runs / "2", tmp_path / "2")
    rows = plan_rows(tmp_path, monkeypatch, capsys, *PARITY)
    assert {label: row["status"] for label, row in rows.items()}[SHARED] == "completed (stage 2)"
    assert {row["status"] for label, row in rows.items() if label != SHARED} == {"new"}


def test_a_relaunch_of_either_stage_trains_nothing_and_a_copy_is_never_counted(shared):
    runs, _ = shared
    assert "stage 2: 1 run; 1 done, skipped" in launch(runs, *STAGE2)
    again = launch(runs, *PARITY)
    assert "stage parity: 3 runs; 3 done, skipped" in again and "0 completed, 0 failed" in again
    assert "referenced" not in again  # recorded the first time
    name = folders(runs, "2")[0]
    shutil.copytree(runs / "2" / name, runs / "parity" / name)  # a copy of the run under the borrower's folder
    try:
        parity = stage_runs(runs, "parity")
        assert len(parity.used) == 3 and {r.label: r.folder for r in parity.used}[SHARED] == runs / "2" / name
        assert [(o.run, o.kind) for o in parity.left_out] == [(f"parity/{name}", "copy")]
    finally:
        shutil.rmtree(runs / "parity" / name)


def test_the_analysis_tables_a_shared_run_in_every_stage_that_uses_it(shared):
    final = load_runs(shared[0]).final()
    assert {("2", SHARED), ("parity", SHARED)} <= set(zip(final["stage"], final["label"], strict=True))


def test_when_the_owners_folder_is_gone_the_borrower_trains_it_and_stage_2_then_references_it(
    tmp_path, shared, monkeypatch, capsys
):
    runs = tmp_path / "runs"
    shutil.copytree(shared[0], runs)  # a copied tree reads the same
    name = folders(runs, "2")[0]
    shutil.rmtree(runs / "2" / name)
    assert plan_rows(runs, monkeypatch, capsys, *PARITY)[SHARED]["status"] == "lost"
    out = launch(runs, *PARITY)
    assert "1 run the ledger holds as done lost their run folder" in out and "1 completed, 0 failed" in out
    assert name in folders(runs, "parity")
    assert {r.label: r.folder for r in stage_runs(runs, "parity").used}[SHARED] == runs / "parity" / name
    # Stage 2 lost its own folder too; parity's now holds the run: referenced, not trained again
    out = launch(runs, *STAGE2)
    assert f"1 run done in another stage, referenced, not trained again: {SHARED} ({runs / 'parity' / name})" in out
    assert "0 completed, 0 failed" in out and folders(runs, "2") == []
    assert [r.folder for r in stage_runs(runs, "2").used] == [runs / "parity" / name]
