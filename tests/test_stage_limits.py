"""What a stage may be called, caused through the real commands: a name that is no single safe folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from stages import env

from cart_sweeps import plan
from cart_sweeps.compose import SEARCHPATH_ENV

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


def cli(runs: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in the folder above `runs`, its runs under `runs`."""
    command = [sys.executable, "-m", module, *args]
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
