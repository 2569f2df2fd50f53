"""The analysis tables each stage from the runs it should: a stage relaunched with another trainer.lr (which
supersedes the cells it re-ran) and a run started by hand in the same folder, all made by the real commands,
then `python -m cart_sweeps.analysis`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from stages import with_fault

from cart_sweeps.analysis.__main__ import main as analysis_main
from cart_sweeps.stagerecord.ledger import merged_launches
from cart_sweeps.stagerecord.runset import StageRecord, stage_ledgers, stage_runs

pytestmark = pytest.mark.slow  # several launches of real stages: the full tier (make test-full)

GRID = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2,6", "trainer.steps=6"]
SLOTS = ["launcher.slots=2", "launcher.poll_s=0.2"]
RELAUNCH = "trainer.lr=1e-3"


def cart_sweeps(runs: Path, *args: str, env: dict[str, str] | None = None) -> None:
    env = env or {**os.environ, "CART_SWEEPS_RUNS": str(runs)}
    done = subprocess.run([sys.executable, "-m", "cart_sweeps", *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def analysis(runs: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m cart_sweeps.analysis` as its main() in process: its exit code and what it printed, without a
    fresh interpreter's imports each time (the command itself is run as a subprocess by tests/test_readme.py)."""
    argv = ["--runs", str(runs), "--out", str(out), *args]
    said, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(err):
        code = analysis_main(argv)
    return subprocess.CompletedProcess(argv, code, said.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_cache) -> Path:
    """Stage 1 launched, relaunched with trainer.lr=1e-3, and one Stage-1 run started by hand (no -m)."""
    root = tmp_path_factory.mktemp("selection") / "runs"
    cart_sweeps(root, "-m", *GRID, *SLOTS)
    cart_sweeps(root, "-m", *GRID, *SLOTS, RELAUNCH)
    cart_sweeps(root, "stage.name=1", "scale=tiny", "trainer.steps=6")  # one run by hand: no stage to run
    return root


def lrs(out: Path) -> set[float]:
    """The trainer.lr of the runs behind the Stage-1 tables: the stage's run folders the selection kept."""
    assert len(pd.read_csv(out / "stage1_grid.csv")) == 2  # P=2 and P=6, one run each
    findings = json.loads((out / "findings.json").read_text())
    root = Path(findings["input"]["source"])
    left_out = {e["run"] for e in findings["selection"]["1"]["excluded"]}
    chosen = [p for p in (root / "1").glob("*/summary.json") if f"1/{p.parent.name}" not in left_out]
    return {json.loads(p.read_text())["trainer"]["lr"] for p in chosen}


def test_tables_hold_each_cells_newest_configuration_and_say_what_they_left_out(runs, tmp_path):
    done = analysis(runs, tmp_path)
    assert done.returncode == 0, done.stderr
    assert lrs(tmp_path) == {1e-3}
    selection = json.loads((tmp_path / "findings.json").read_text())["selection"]["1"]
    assert selection["runs"] == 2
    reasons = {e["label"]: (e["reason"], e["differs"]) for e in selection["excluded"]}
    assert set(reasons) == {"d32-P2-R2-s42", "d32-P6-R2-s42", "d64-P2-R4-s42"}
    assert reasons["d32-P2-R2-s42"] == ("superseded by a newer configuration", ["trainer.lr 0.003 -> 0.001"])
    assert reasons["d32-P6-R2-s42"] == reasons["d32-P2-R2-s42"]
    assert reasons["d64-P2-R4-s42"][0] == "started by hand: in no launch"
    report = (tmp_path / "report.md").read_text()
    assert "trainer.lr 0.003 -> 0.001" in report and re.search(r"1/d64-P2-R4-s42-\w{8}: started by hand", report)
    assert (tmp_path / "stage1_grid.md").read_text().startswith("Runs: stage 1: ")
    assert "left out 1/d64-P2-R4-s42" in done.stdout


def test_the_compute_front_costs_the_loaded_runs_from_their_records_composing_nothing(runs):
    """The compute front read each run's folder again and composed the screen stage's recipe inside the analysis;
    it is costed from the runs the analysis loaded (their recorded model and sequence length), composing nothing."""
    from omegaconf import OmegaConf

    from cart_sweeps.analysis import pareto
    from cart_sweeps.analysis.load import load_runs
    from cart_sweeps.model.params import train_flops_per_token

    pareto._screen_gflops.cache_clear()  # another test in this process may have costed a results CSV
    final = load_runs(runs).final()
    front = pareto.compute_cells(final, "ppl_austen")
    assert pareto._screen_gflops.cache_info().currsize == 0  # none costed at the paper's recipe
    used = final[final["stage"] == "1"]
    by_hand = {}
    for folder in used["run_dir"]:  # each run's cost from its summary.json, by the model's formula
        summary = json.loads((Path(folder) / "summary.json").read_text())
        model = summary["model"]
        cost = train_flops_per_token(OmegaConf.create(model), summary["trainer"]["seq_len"]) / 1e9
        by_hand[(model["d_model"], model["n_prelude"], model["n_loops"])] = cost
    assert len(front) == len(by_hand) == 2
    for _, cell in front.iterrows():
        assert cell["gflops_per_token"] == pytest.approx(by_hand[(cell["d"], cell["P"], cell["R"])], rel=1e-12)


def test_where_and_launch_select_the_earlier_runs(runs, tmp_path):
    done = analysis(runs, tmp_path, "--where", "trainer.lr=0.003", "--launch", "1")
    assert done.returncode == 0, done.stderr
    assert lrs(tmp_path) == {3e-3}
    assert "where trainer.lr=0.003" in (tmp_path / "stage1_grid.md").read_text().splitlines()[0]
    assert analysis(runs, tmp_path, "--where", "trainer.nope=1").stderr.strip() == (
        "analysis: --where trainer.nope=1: no run records trainer.nope (keys look like trainer.lr, model.d_model)"
    )


def test_a_deleted_run_folder_of_the_newest_launch_is_listed_missing(runs, tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    gone = next(p.parent for p in (copy / "1").glob("d32-P2-R2-*/summary.json") if _lr(p) == 1e-3)
    shutil.rmtree(gone)
    done = analysis(copy, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "findings.json").read_text())["selection"]["1"]["missing"] == [
        "d32-P2-R2-s42"
    ]
    assert "missing d32-P2-R2-s42" in (tmp_path / "out" / "report.md").read_text()


def test_launches_recorded_by_the_driver_choose_by_number(runs, tmp_path):
    """Each launch of the stage is in its ledger; --launch N picks one of them."""
    done = analysis(runs, tmp_path / "latest")
    assert done.returncode == 0, done.stderr
    assert "stage 1: each cell's newest configuration over 2 launches, 2 runs" in done.stdout
    assert "superseded by a newer configuration; trainer.lr 0.003 -> 0.001" in done.stdout
    assert analysis(runs, tmp_path / "first", "--launch", "1").returncode == 0
    assert lrs(tmp_path / "first") == {3e-3}
    assert analysis(runs, tmp_path / "x", "--launch", "3").stderr == "analysis: --launch 3: stage 1 has launches 1..2\n"


def test_a_damaged_ledger_falls_back_to_every_run_and_says_so(runs, tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    (copy / "1" / "ledger.db").write_bytes(b"")
    done = analysis(copy, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "its ledger does not open" in (tmp_path / "out" / "stage1_grid.md").read_text().splitlines()[0]


def _lr(summary: Path) -> float:
    return json.loads(summary.read_text())["trainer"]["lr"]


def test_a_relaunch_recorded_by_a_host_whose_clock_is_behind_is_still_the_newest(tmp_path, data_cache):
    """Launches were ordered by their hosts' clocks: a relaunch with trainer.lr=1e-3 from a host an hour behind
    (an NTP step, a restored VM, another login node on a shared file system) read as the older one, so `plan`, the
    run set and the analysis tabled the 3e-3 runs and listed the new ones as superseded, 0.001 -> 0.003."""
    runs = tmp_path / "runs"
    cart_sweeps(runs, "-m", *GRID, *SLOTS, "trainer.lr=3e-3")
    cart_sweeps(runs, "-m", *GRID, *SLOTS, RELAUNCH, env=with_fault(runs, "clock:behind:3600", tmp_path / "mark"))
    first, second = merged_launches(stage_ledgers(runs / "1", "1", StageRecord.read(runs / "1"))[0])
    assert second["at"] < first["at"]  # recorded an hour "before" the launch it followed

    command = [sys.executable, "-m", "cart_sweeps.plan", *GRID, RELAUNCH]
    listed = subprocess.run(command, env={**os.environ, "CART_SWEEPS_RUNS": str(runs)}, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "its tables use 2 runs" in listed.stdout and "2 superseded (trainer.lr 0.003 -> 0.001)" in listed.stdout
    chosen = stage_runs(runs, "1")
    assert {run.summary.details["trainer"]["lr"] for run in chosen.used if run.summary} == {1e-3}
    assert [o.differs for o in chosen.left_out] == [["trainer.lr 0.003 -> 0.001"]] * 2
    done = analysis(runs, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert lrs(tmp_path / "out") == {1e-3}
    assert "superseded by a newer configuration; trainer.lr 0.003 -> 0.001" in done.stdout
