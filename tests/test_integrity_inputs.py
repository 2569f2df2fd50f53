"""What a run was computed from is part of what it is: the data it read, the checkpoint it evaluated and
the settings it measured with. Each fault is caused for real: a bin overwritten in place, a real stage
expansion against a real source folder, an evaluation past exp's range, a stage's progress line."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys

import pytest
from rich.console import Console
from stages import env
from test_identity import completed_source

from cart_sweeps.compose import compose_config
from cart_sweeps.data.loader import load_prepared
from cart_sweeps.record.runfolder import checkpoint_path
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.expand import Stage
from cart_sweeps.sweep.progress import Progress
from cart_sweeps.train.loop import Diverged, eval_metrics, raise_if_diverged

ONE_RUN = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2", "trainer.steps=5"]


def test_an_overwritten_bin_is_refused_before_launch(tmp_path, data_cache):
    """Item 3: train.bin zeroed in place (same size) trained silently, under a clean run's id."""
    load_prepared(compose_config(["scale=tiny"]).data)  # the session's cache, prepared once
    cache = tmp_path / "cache"
    shutil.copytree(data_cache, cache)
    (train,) = cache.glob("*/*/train.bin")
    train.write_bytes(bytes(train.stat().st_size))
    command = [sys.executable, "-m", "cart_sweeps", *ONE_RUN, f"data.cache_dir={train.parents[1]}"]
    proc = subprocess.run(command, env=env(tmp_path / "runs"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{train} is not what was prepared" in proc.stderr and "cart_sweeps.data.prepare" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_harness_settings_and_the_checkpoint_name_an_evaluation(tmp_path):
    """Items 1-2: other tasks or another limit said '1 done, skipped'; so did a source trained further."""
    source = tmp_path / "source"
    completed_source(source)

    def run_id(*extra: str) -> str:
        (run,) = Stage(
            ["stage=variable_r", "scale=tiny", f"stage.source={source}", "stage.eval_n_loops=2", *extra]
        ).runs
        return run.run_id

    ids = {run_id("harness.tasks=[]"), run_id("harness.tasks=[cart_lastword]"), run_id("harness.limit=5")}
    next((source / "checkpoints").iterdir()).write_bytes(b"the source trained again")
    ids.add(run_id("harness.tasks=[]"))
    assert len(ids) == 4


def test_a_source_without_its_final_checkpoint_is_one_line(tmp_path):
    """Item 1: a source whose final checkpoint was deleted was evaluated, silently, at the one before (a source
    still training: test_integrity_stage.py)."""
    source = tmp_path / "source"
    completed_source(source)
    summary = json.loads((source / "summary.json").read_text())
    final = checkpoint_path(source, summary["step"])
    final.rename(checkpoint_path(source, summary["step"] - 1))  # the checkpoint before the final one is all left
    command = [sys.executable, "-m", "cart_sweeps", "stage=variable_r", "scale=tiny", f"stage.source={source}"]
    proc = subprocess.run(command, env=env(tmp_path / "runs"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"its final checkpoint {final.name} (step {summary['step']}) is gone" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_an_evaluation_past_exps_range_is_a_divergence():
    """Item 7: math.exp(mean CE) raised OverflowError, so the run was failed and retried on every relaunch."""
    metrics = {f"{k}_austen": v for k, v in eval_metrics(800.0, 3.5).items()}
    assert metrics["ppl_austen"] == math.inf and metrics["ce_austen"] == 800.0
    with pytest.raises(Diverged, match="ppl_austen is inf .mean CE 800. at step 40; lower trainer.lr"):
        raise_if_diverged(metrics, "at step 40")


def test_diverged_runs_are_results_in_the_progress_line():
    """Item 11: a diverged run was counted as failed in the progress bracket."""
    out = io.StringIO()
    progress = Progress("1", 2, "ppl_austen", Console(file=out, width=300))
    progress.started()
    progress.finished("d32-P2-R2-s42", RunStatus.DIVERGED, RunSummary(RunStatus.DIVERGED, error="loss nan"), True)
    assert "1/2 done, 0 running, 0 failed, 1 left" in out.getvalue()
