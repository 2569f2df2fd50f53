"""A stage file's numbers at the run's own scale (`stage.numbers: own`), and the paper's numbers mapped without a
surprise: through `python -m cart_sweeps.plan` on real stage files in a temporary --config-dir."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from stages import env

from cart_sweeps.compose import SEARCHPATH_ENV
from cart_sweeps.config import ConfigError
from cart_sweeps.sweep.expand import Stage

REPO = Path(__file__).parents[1]
STAGE = """\
name: {name}
numbers: {numbers}
grid:
  trainer.warmup_steps: [2, 8]
recipe:
  seed: 42
  model.d_model: {width}
  model.n_prelude: 2
  model.n_loops: 2
  trainer.steps: 20
"""


def stage_dir(tmp_path: Path, numbers: str, width: int = 48) -> Path:
    (tmp_path / "stage").mkdir(exist_ok=True)
    (tmp_path / "stage" / "mine.yaml").write_text(STAGE.format(name="mine", numbers=numbers, width=width))
    return tmp_path


def plan(config_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "cart_sweeps.plan", "--config-dir", str(config_dir), "stage=mine", *args]
    return subprocess.run(command, env=env(config_dir / "runs"), capture_output=True, text=True, cwd=REPO)


@pytest.fixture
def stage(monkeypatch):
    """stage(config_dir, *args): the Stage `--config-dir config_dir stage=mine *args` launches, in this process."""

    def make(config_dir: Path, *args: str) -> Stage:
        monkeypatch.setenv(SEARCHPATH_ENV, json.dumps([f"file://{config_dir}"]))
        return Stage(["stage=mine", *args])

    return make


def test_a_stage_files_own_numbers_are_used_as_written(tmp_path, stage):
    """At scale=tiny, `numbers: own`: 20 steps are 20 (not 1), warm-ups 2 and 8 are two runs, a width of 48 is 48."""
    config_dir = stage_dir(tmp_path, "own")
    done = plan(config_dir, "scale=tiny", "plan.format=csv", "plan.gpu=h100")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert sorted((r["model.d_model"], r["trainer.warmup_steps"], r["paper"]) for r in rows) == [
        ("48", "2", ""),
        ("48", "8", ""),
    ]
    runs = stage(config_dir, "scale=tiny").runs
    assert sorted((r.config.cfg.trainer.steps, r.config.cfg.trainer.warmup_steps) for r in runs) == [(20, 2), (20, 8)]
    assert all(not r.config.cfg.scale.paper for r in runs)  # nothing mapped, so nothing to show as mapped


def test_paper_numbers_that_the_scale_collapses_are_refused_in_one_line(tmp_path):
    """The default (the paper's numbers): warm-ups 2 and 8 of a 20-step run both shrink to 1 at scale=tiny."""
    done = plan(stage_dir(tmp_path, "paper"), "scale=tiny")
    assert done.returncode == 2
    assert done.stderr == (
        "error: stage mine: trainer.warmup_steps 2 and 8 are both 1 at scale=tiny (the stage's numbers are the "
        "paper's, and scale=tiny shrinks them), so their runs would be one; write the stage's numbers at the run's "
        "scale (stage.numbers: own in its file), or pick values that stay apart\n"
    )


def test_a_width_the_scale_shows_reads_back_and_one_it_lacks_is_explained(tmp_path, stage):
    """In a stage file of paper numbers at scale=tiny, 48 is scale=tiny's width of the paper's 512 (as on the command
    line); 40 is neither, and the message lists 40 nowhere as allowed."""
    config_dir = stage_dir(tmp_path, "paper")
    (config_dir / "stage" / "mine.yaml").write_text(
        STAGE.format(name="mine", numbers="paper", width=48).replace("[2, 8]", "[100, 800]").replace(": 20", ": 3000")
    )
    runs = stage(config_dir, "scale=tiny").runs
    assert {(r.params.get("model.d_model"), r.config.cfg.model.d_model) for r in runs} == {(None, 48)}
    assert {r.config.cfg.scale.paper["model.d_model"] for r in runs} == {512}  # mapped: shown in plan and at launch
    (config_dir / "stage" / "mine.yaml").write_text(STAGE.format(name="mine", numbers="paper", width=40))
    with pytest.raises(ConfigError) as err:
        stage(config_dir, "scale=tiny")
    message = str(err.value)
    assert message.startswith("model.d_model=40 is neither a paper width (256, 512, 768, 1024) nor one of their")
    assert "stage.numbers: own" in message and "(32, 48, 64, 96)" in message


def test_the_shipped_stages_keep_their_paper_numbers():
    """`numbers` defaults to paper: Stage 1 at scale=tiny still runs 20 steps of d=32 for the paper's 3000 of d=256."""
    runs = Stage(["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2"]).runs
    assert [(r.config.cfg.trainer.steps, r.config.cfg.model.d_model, r.actual) for r in runs] == [
        (20, 32, {"model.d_model": 32})
    ]
