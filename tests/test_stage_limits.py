"""What a stage may be called, how long its labels may grow and how many runs it may have, each caused through the
real commands: a name that is no single safe folder, labels too long for a file name, a grid past stage.max_runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from stages import env, sweep

from cart_sweeps import plan
from cart_sweeps.compose import SEARCHPATH_ENV
from cart_sweeps.naming import LABEL_BYTES, axis_tag, seeded_label
from cart_sweeps.sweep.expand import Stage

NAME_RULE = "use at most 128 letters, digits, '-', '_' and '.'"
ONE_RUN = ["scale=tiny", "model.d_model=32", "model.n_prelude=2", "model.n_loops=2"]


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv(SEARCHPATH_ENV, "[]")  # a test's --config-dir reaches no other test
    return tmp_path / "runs"


def stage_file(folder: Path, option: str, stage: dict) -> Path:
    """A user's config folder holding the stage file `<folder>/stage/<option>.yaml`."""
    (folder / "stage").mkdir(parents=True, exist_ok=True)
    (folder / "stage" / f"{option}.yaml").write_text(yaml.safe_dump(stage))
    return folder


# Runs a command and adds its peak memory (KB) to its stderr: a small parent's wait4, as a child forked from pytest
# starts with pytest's pages counted.
MEASURED = (
    "import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:]); _, status, usage = os.wait4(p.pid, 0); "
    "print(usage.ru_maxrss, file=sys.stderr); sys.exit(os.waitstatus_to_exitcode(status))"
)


def cli(runs: Path, module: str, *args: str, measured: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in the folder above `runs`, its runs under `runs`."""
    command = [sys.executable, *(["-c", MEASURED, sys.executable] if measured else []), "-m", module, *args]
    return subprocess.run(command, env=env(runs), capture_output=True, text=True, timeout=300, cwd=runs.parent)


def plan_fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`python -m cart_sweeps.plan ARGS` as its entry point runs it: exit 2 and one line, the line."""
    with pytest.raises(SystemExit) as exit_:
        plan.run_cli(plan.main, plan.USAGE, args)
    out, err = capsys.readouterr()
    assert (exit_.value.code, out, len(err.splitlines())) == (2, "", 1), err
    return err


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["stage=1", "stage.name=../esc"], "../esc"),
        (["stage=1", "stage.name='1~x'"], "1~x"),
        (["stage=1", "stage.name=.."], ".."),
        (["stage=1", "stage.name=''"], ""),
        (["stage=1", "stage.name=a/b"], "a/b"),
        (["stage=1", f"stage.name={'n' * 129}"], "n" * 129),
        (["stage=2", "stage.select=zoom", "stage.zoom_from=../1"], "../1"),
    ],
)
def test_plan_refuses_a_stage_name_that_is_no_single_safe_folder(runs_dir, capsys, args, name):
    err = plan_fails([*args, *ONE_RUN], capsys)
    assert f"={name}: a stage's name is its folder under paths.runs" in err and NAME_RULE in err
    assert not runs_dir.parent.joinpath("esc").exists() and not runs_dir.exists()


def test_a_stage_files_name_is_checked_too(runs_dir, tmp_path, capsys):
    mine = stage_file(tmp_path / "cfg", "mine", {"name": "mine~1", "grid": {"model.n_loops": [2]}})
    err = plan_fails(["--config-dir", str(mine), "stage=mine", *ONE_RUN], capsys)
    assert err.startswith("error: stage.name=mine~1: ") and NAME_RULE in err


@pytest.mark.parametrize(
    "args",
    [
        ["stage=1", "stage.name=../esc", "sweep.storage=study.db"],
        ["stage=1", "stage.name='1~x'", "sweep.storage=study.db"],  # would join stage 1's studies in study.db
        ["stage.name=../esc", "trainer.steps=1"],  # a single run's folder is <paths.runs>/<stage.name>/<label>
    ],
)
def test_the_driver_and_a_single_run_refuse_it_before_anything_is_written(tmp_path, args):
    done = cli(tmp_path / "runs", "cart_sweeps", *args, *ONE_RUN)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert NAME_RULE in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no ledger, no runs folder, no study.db, no esc/


def test_a_label_too_long_for_a_folder_name_is_cut_with_a_hash_of_what_it_cut():
    short = ("d32-P2-R2-lr1e-3", "")
    assert seeded_label(short, 42) == "d32-P2-R2-lr1e-3-s42"  # one that fits is as it always was
    fits = ("d" * (LABEL_BYTES - 4), "")
    assert seeded_label(fits, 42) == f"{fits[0]}-s42" and len(f"{seeded_label(fits, 42)}-12345678") == 255
    long, other = ("d32-" + "x" * 300, "-at-R6-5shot"), ("d32-" + "x" * 299 + "y", "-at-R6-5shot")
    label = seeded_label(long, 7)
    assert len(label.encode()) == LABEL_BYTES and label.startswith("d32-xxx") and label.endswith("-s7-at-R6-5shot")
    assert label == seeded_label(long, 7) != seeded_label(other, 7)  # stable; unique past the cut
    assert seeded_label(long, 8) == label.replace("-s7-", "-s8-")  # a configuration's seeds share the cut
    wide = seeded_label(("d32-" + "é" * 200, ""), 1)  # cut between characters, never inside one
    assert len(wide.encode()) <= LABEL_BYTES and wide.encode().decode() == wide


def test_a_value_with_a_path_separator_is_one_folder_in_a_label():
    """A string axis whose values hold a `/` (a data file `a/b.jsonl`) nested each run's folder one deeper."""
    assert axis_tag("data.sources.0.path", "team/a.jsonl") == "path_team_a.jsonl"


LONG = {
    "name": "long",
    "grid": {"model.n_loops": [2, 4], "logger.project": ["cart-" + "x" * 250], "trainer.lr": [1.0e-3]},
    "recipe": {"seed": 42, "model.d_model": 256, "model.n_prelude": 2, "trainer.steps": 3000},
}


def test_plan_lists_the_folders_of_labels_too_long_for_a_file_name(runs_dir, tmp_path, capsys):
    mine = stage_file(tmp_path / "cfg", "long", LONG)
    plan.run_cli(plan.main, plan.USAGE, ["--config-dir", str(mine), "stage=long", "scale=tiny"])
    out = capsys.readouterr().out
    stage = Stage(["stage=long", "scale=tiny"])
    assert {len(run.run_dir.name.encode()) for run in stage.runs} == {255}
    for run in stage.runs:
        assert f"{run.run_id}  {run.label}  " in out and run.run_dir.name == f"{run.label}-{run.run_id[:8]}"


@pytest.mark.slow  # a launch of two runs and its relaunch
def test_a_stage_with_labels_too_long_for_a_file_name_runs_and_its_relaunch_finds_them_done(tmp_path, data_cache):
    mine, runs = stage_file(tmp_path / "cfg", "long", LONG), tmp_path / "runs"
    first = sweep(runs, "--config-dir", str(mine), "stage=long", "scale=tiny", "trainer.steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    folders = sorted(p for p in (runs / "long").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(folders) == 2 and all(len(f.name.encode()) <= 255 for f in folders)
    assert all("completed" in (f / "summary.json").read_text() for f in folders)
    again = sweep(runs, "--config-dir", str(mine), "stage=long", "scale=tiny", "trainer.steps=2")
    assert again.returncode == 0 and "2 runs; 2 done, skipped" in again.stdout, again.stdout + again.stderr
    listed = cli(runs, "cart_sweeps.plan", "--config-dir", str(mine), "stage=long", "scale=tiny", "trainer.steps=2")
    for folder in folders:
        label, id8 = folder.name.rsplit("-", 1)
        assert re.search(rf"{id8}\w{{4}}  {re.escape(label)}  .* completed$", listed.stdout, re.M), listed.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["stage=1", "seed=range(0,2000000)"],
            "stage 1 has 128,000,000 runs (4 model.d_model x 4 model.n_loops x 4 model.n_prelude x 2,000,000 seed), "
            "more than stage.max_runs=100,000; narrow it, or allow it with stage.max_runs=128000000",
        ),
        (
            ["stage=1", "stage.max_runs=63"],
            "stage 1 has 64 runs (4 model.d_model x 4 model.n_loops x 4 model.n_prelude)",
        ),
        (["stage=ablations", "stage.max_runs=7"], "stage ablations has 8 runs (8 variant)"),
        (["stage=1", "trainer.lr=range(0,100,0.0009765625)"], "6,553,600 runs (4 model.d_model x 4 model.n_loops x "),
        (
            ["stage=lr", "sweep.sampler=tpe", "sweep.n_trials=100001"],
            "stage lr has 100,001 runs (100,001 sweep.n_trials)",
        ),
        (["stage=1", "seed=range(0,5,0)"], "seed=range(0,5,0): a range's step cannot be 0"),
    ],
)
def test_plan_refuses_a_stage_past_max_runs_before_listing_its_grid(runs_dir, capsys, args, says):
    assert says in plan_fails(args, capsys)
    assert not runs_dir.exists()


def test_a_stage_at_max_runs_is_planned(runs_dir, capsys):
    plan.run_cli(plan.main, plan.USAGE, ["stage=1", "stage.max_runs=64", "plan.format=csv"])
    assert len(capsys.readouterr().out.splitlines()) == 1 + 64


def test_the_driver_and_plan_refuse_it_at_the_memory_of_a_one_run_stage(tmp_path):
    """`seed=range(0,2000000)` used 2.9 GB of `plan` before it was stopped: the driver and plan now count first."""
    runs = tmp_path / "runs"
    for module in ("cart_sweeps", "cart_sweeps.plan"):
        done = cli(runs, module, "stage=1", "scale=tiny", "seed=range(0,2000000)", measured=True)
        *err, peak_kb = done.stderr.splitlines()
        assert done.returncode == 2 and len(err) == 1 and "128,000,000 runs" in err[0], done.stderr
        assert int(peak_kb) < 300 * 1024  # ~80 MB here, as for a one-run stage
    assert list(tmp_path.iterdir()) == []
