"""Before launch, one line each, through the real commands: a training stage at the paper's scale whose runs get no
GPU, data only the hub gives that is not prepared, and `plan`'s estimate of this machine's time; then a paper-scale
attempt on a finished tiny stage leaves the tiny study's run set and findings as they were."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from stages import env, sweep

from cart_sweeps.stagerecord.runset import stage_runs

REPO = Path(__file__).parents[1]
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # no GPU visible to the local launcher, as on a CPU-only machine


def command(runs: Path, module: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env(runs, **extra), capture_output=True, text=True, cwd=REPO
    )


def test_the_headline_command_without_a_gpu_is_refused_in_one_line(tmp_path):
    """`python -m cart_sweeps stage=1` (scale=paper) with no GPU: one line naming scale=tiny, plan and the force
    switch, and nothing written."""
    done = command(tmp_path / "runs", "cart_sweeps", "stage=1", **NO_GPU)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    line = done.stderr
    assert line.startswith(
        "error: stage 1 is at scale=paper (the paper's widths and run lengths) and its runs get no GPU"
    )
    assert "scale=tiny" in line and "python -m cart_sweeps.plan stage=1 scale=tiny" in line
    assert "launcher.allow_cpu=true" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_slurm_launch_is_not_refused_for_the_drivers_machine_but_unprepared_hub_data_is(tmp_path):
    """The SLURM launcher's runs get the cluster's GPUs; the paper's hub data, not prepared, is named with the
    command that prepares it (the command line's data settings included)."""
    cache = tmp_path / "cache"
    done = command(tmp_path / "runs", "cart_sweeps", "stage=1", "launcher=slurm", f"data.cache_dir={cache}", **NO_GPU)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: data=paper_mix is not prepared in {cache}")
    assert f"`python -m cart_sweeps.data.prepare data=paper_mix data.cache_dir={cache}`" in done.stderr
    assert not (tmp_path / "runs").exists()
    forced = command(tmp_path / "runs", "cart_sweeps", "stage=1", "launcher.allow_cpu=true", f"data.cache_dir={cache}")
    assert forced.stderr.startswith("error: data=paper_mix is not prepared"), forced.stderr  # past the GPU check


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_plan_estimates_this_machines_time_where_no_gpu_is_named(tmp_path):
    done = command(tmp_path / "runs", "cart_sweeps.plan", "stage=1", "scale=tiny", **NO_GPU)
    assert done.returncode == 0, done.stderr
    assert "on this machine: about " in done.stdout and "plan.gpu=NAME" in done.stdout
    named = command(tmp_path / "runs", "cart_sweeps.plan", "stage=1", "scale=tiny", "plan.gpu=a100")
    assert named.returncode == 0 and "on this machine" not in named.stdout


TINY = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2,6", "trainer.steps=6"]
# The same cells at the paper's scale, forced past the GPU check on the embedded corpus; each run fails at once
# (a vocabulary smaller than the data's), as the rejected runs did
PAPER = ["stage=1", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2,6", "data=embedded"]
PAPER += ["sweep.metric=ppl_austen", "launcher.allow_cpu=true", "model.vocab_size=100", "sweep.max_retries=0"]


def findings(runs: Path, out: Path) -> dict:
    done = command(runs, "analysis", "--runs", str(runs), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads((out / "findings.json").read_text())


def without_basis(found: dict) -> dict:
    """Findings less where they were written and the run set's basis (which names the other scale now held)."""
    found = {k: v for k, v in found.items() if k != "input"}
    found["selection"] = {s: {k: v for k, v in sel.items() if k != "basis"} for s, sel in found["selection"].items()}
    return found


@pytest.mark.slow  # two launches and two analyses: ~1 min on 2 cores
def test_a_paper_scale_attempt_leaves_a_finished_tiny_stage_as_it_was(tmp_path, data_cache):
    runs = tmp_path / "runs"
    tiny = sweep(runs, *TINY)
    assert tiny.returncode == 0, tiny.stderr[-3000:]
    assert "stage 1 at scale=tiny: its paper numbers mapped: " in tiny.stdout  # the one line at launch
    before, found = stage_runs(runs, "1"), findings(runs, tmp_path / "a")
    paper = sweep(runs, *PAPER)
    assert paper.returncode == 1, paper.stderr[-3000:]  # its runs failed
    after = stage_runs(runs, "1")
    assert [(r.run_id, r.status) for r in after.used] == [(r.run_id, r.status) for r in before.used]
    assert (
        (after.left_out, after.pending, after.missing)
        == (before.left_out, before.pending, before.missing)
        == (
            [],
            [],
            [],
        )
    )
    assert after.scale == "tiny" and after.record is not None and after.record.metric == "ppl_austen"
    assert "the stage also holds runs at scale=paper" in after.basis
    assert [r.status for r in stage_runs(runs, "1", scale="paper").pending] == ["rejected", "rejected"]
    assert without_basis(findings(runs, tmp_path / "b")) == without_basis(found)
