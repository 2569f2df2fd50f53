"""Settings the driver refuses are refused by `plan` too, each in one line before anything launches (issue 48,
item 11): a relative sweep.storage that leaves the runs root (two roots would share a study), a stage.drift that
is not finite, a metric the data does not measure, an empty sweep (was a StopIteration traceback), and a
trainer.branch_from given to a multirun whose runs are not its continuation (was refused job by job, after launch)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from stages import env

from cart_sweeps import plan
from cart_sweeps.compose import compose_config
from cart_sweeps.config import ConfigError


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["stage=1", "sweep.storage=../shared.db"], r"sweep.storage=../shared.db leaves the runs root .*runs \("),
        (["stage=1", "sweep.storage=sqlite:///../x.db"], r"sweep.storage=sqlite:///../x.db leaves the runs root"),
        (["stage=ladder", "stage.drift=inf"], r"stage.drift=inf must be a finite number >= 0"),
        (["stage=ladder", "stage.drift=nan"], r"stage.drift=nan must be a finite number >= 0"),
        (["stage=1", "sweep.metric=ppl_wiki"], r"sweep.metric=ppl_wiki is not measured with data=embedded"),
        (["stage=1", "seed=range(0,0)"], r"seed=range\(0,0\) sweeps no values: give seed at least one"),
    ],
)
def test_plan_refuses_what_the_driver_refuses(tmp_path, monkeypatch, args, says):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match=says):
        plan.main(["scale=tiny", *args])


def test_a_relative_storage_inside_the_runs_root_is_kept_there(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path / "runs"))
    plan.main(["stage=1", "scale=tiny", "sweep.storage=shared/../study.db"])
    assert "stage 1 at scale=tiny: 64 runs" in capsys.readouterr().out


def wsd_parent(folder, seed: int) -> None:
    """A parent run folder as far as a branch reads it before its checkpoint: its config.yaml."""
    folder.mkdir(parents=True)
    cfg = compose_config(["scale=tiny", "model.d_model=32", "trainer.schedule=wsd", "trainer.steps=10", f"seed={seed}"])
    OmegaConf.save(cfg, folder / "config.yaml", resolve=True)  # as a run writes it


@pytest.mark.slow  # two driver processes (over 3 s of the fast tier's 2 cores)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["seed=range(0,0)"], "error: seed=range(0,0) sweeps no values: give seed at least one"),
        (["seed=1,2", "trainer.branch_from={parent}"], "error: trainer.branch_from={parent} is another run: its seed"),
    ],
)
def test_the_driver_refuses_them_in_one_line_with_nothing_launched(tmp_path, args, says):
    parent = tmp_path / "parent"
    wsd_parent(parent, 42)
    runs = tmp_path / "runs"
    command = ["-m", "scale=tiny", "model.d_model=32", "trainer.schedule=wsd", "trainer.steps=10"]
    command += [a.format(parent=parent) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", "cart_sweeps", *command], env=env(runs), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(says.format(parent=parent)), done.stderr
    assert not list(runs.glob("*/*/config.yaml"))  # no run folder written
