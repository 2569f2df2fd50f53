"""`launcher=slurm`: a tiny stage as real SLURM job arrays, and a job requeued after a timeout signal.

Needs the real single-node cluster of tests/slurm (skipped cleanly when none answers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import submitit
from optuna.trial import TrialState

pytestmark = pytest.mark.slurm

GRID = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_prelude=2", "sweep.metric=ppl_austen"]


def slurm_args(cluster) -> list[str]:
    return [
        "launcher=slurm",
        f"launcher.partition={cluster.partition}",
        "launcher.gpus_per_task=0",
        "launcher.cpus_per_task=1",
        "launcher.mem_gb=1",
        "launcher.timeout_min=10",
        "launcher.signal_delay_s=5",
        "launcher.poll_s=1",
    ]


def driver(runs: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CART_SWEEPS_RUNS": str(runs)}
    cmd = [sys.executable, "-m", "cart_sweeps", "-m", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def trials(runs: Path) -> list[optuna.trial.FrozenTrial]:
    path = runs / "1" / "ledger.db"
    if not path.exists():
        return []
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name="1", storage=f"sqlite:///{path}").trials
    except KeyError:  # the driver has not created its study yet
        return []


def test_tiny_array_completes(slurm_cluster, tmp_path, data_cache):
    proc = driver(tmp_path, *GRID, "model.n_loops=2,4", *slurm_args(slurm_cluster))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    done = trials(tmp_path)
    assert len(done) == 2 and {t.state for t in done} == {TrialState.COMPLETE}
    assert all("_" in t.user_attrs["job_id"] for t in done)  # array tasks: <array id>_<index>


def test_timeout_signal_requeues_and_resumes(slurm_cluster, tmp_path, data_cache):
    """job._interrupt(timeout=True) once the run has a checkpoint: the job is requeued, the run resumes."""
    steps = ["trainer.steps=400", "trainer.ckpt_every=20", "trainer.eval_every=400"]
    proc = driver(tmp_path, *GRID, "model.n_loops=2", *steps, *slurm_args(slurm_cluster))
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, proc.stdout.read()[-3000:] if proc.stdout else ""
        found = trials(tmp_path)
        ckpts = list(Path(found[0].user_attrs["run_dir"]).glob("checkpoints/*")) if found else []
        if ckpts:
            break
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(1)
    job = submitit.SlurmJob(tmp_path / "1" / ".submitit", found[0].user_attrs["job_id"])
    job._interrupt(timeout=True)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    (trial,) = trials(tmp_path)
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["results"]["step"] == 400
    log = (Path(trial.user_attrs["run_dir"]) / "run.log").read_text()  # the run's own output, across requeues
    assert "resuming from step" in log, log[-3000:]


def test_scancel_is_recorded_as_cancelled_and_not_retried(slurm_cluster, tmp_path, data_cache):
    """A job cancelled on the cluster showed as 'has not produced any output' and was retried as failed."""
    steps = ["trainer.steps=400", "trainer.ckpt_every=20", "trainer.eval_every=400", "sweep.max_retries=2"]
    proc = driver(tmp_path, *GRID, "model.n_loops=2", *steps, *slurm_args(slurm_cluster))
    deadline = time.monotonic() + 300
    while not ((found := trials(tmp_path)) and "job_id" in found[0].user_attrs and _training(found[0])):
        assert proc.poll() is None, proc.stdout.read()[-3000:] if proc.stdout else ""
        assert time.monotonic() < deadline, "the run did not start training within 300 s"
        time.sleep(1)
    subprocess.run(["scancel", found[0].user_attrs["job_id"]], check=True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-3000:]
    (trial,) = trials(tmp_path)  # one attempt: a cancelled run is not retried
    assert trial.user_attrs["status"] == "cancelled", trial.user_attrs
    assert trial.user_attrs["error"] == "cancelled on the cluster (scancel)"


def _training(trial) -> bool:
    return (Path(trial.user_attrs["run_dir"]) / "summary.json").exists()


def test_an_sbatch_refusal_is_one_line_and_leaves_no_run_cut_off(slurm_cluster, tmp_path, data_cache):
    """A GPU asked of a cluster without one: sbatch refuses; the launch names the setting, and the next
    launch starts the run afresh instead of calling it cut off."""
    args = [*GRID, "model.n_loops=2", *slurm_args(slurm_cluster)]
    out, _ = driver(tmp_path, *args, "launcher.gpus_per_task=1").communicate(timeout=300)
    lines = out.strip().splitlines()
    assert lines[-1].startswith("error: sbatch refused the stage's jobs: Invalid generic resource"), out[-3000:]
    assert "launcher.gpus_per_task" in lines[-1] and "Traceback" not in out, out[-3000:]
    assert [t.user_attrs["status"] for t in trials(tmp_path)] == ["rejected"]
    proc = driver(tmp_path, *args)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "0 cut off, resumed" in out, out[-3000:]
    assert trials(tmp_path)[-1].state == TrialState.COMPLETE


def test_a_pending_job_shows_slurms_reason(slurm_cluster, tmp_path, data_cache):
    begin = "+launcher.additional_parameters.begin=now+1hour"
    proc = driver(tmp_path, *GRID, "model.n_loops=2", *slurm_args(slurm_cluster), begin)
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    lines = []
    while not lines or "1 pending (BeginTime)" not in lines[-1]:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)[-3000:]
        lines.append(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert not subprocess.run(["squeue", "--noheader", "--name=cart-1"], capture_output=True, text=True).stdout
