"""A run folder never loses, mixes up or fakes results: real processes, real faults, real files.

Each fault is applied to a copy of a finished reference run (or to a live run), the same command is
relaunched, and the folder must end as the uninterrupted reference did: completed, the same final
metrics, the same metrics.jsonl rows, and nothing trained again that a checkpoint still held.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from test_train import cli, rows, summary

from cart_sweeps.compose import compose_config
from cart_sweeps.config import ConfigError
from cart_sweeps.run import Trainer, execute

pytestmark = pytest.mark.slow  # faults caused in real runs, each relaunched: the full tier (make test-full)

TINY = [
    "scale=tiny",
    "trainer.steps=20",
    "trainer.ckpt_every=10",
    "trainer.eval_every=10",
    "trainer.log_every=5",
    "trainer.deterministic=true",
]


def launch(run_dir: Path, *extra: str):
    return cli([*TINY, *extra, f"hydra.run.dir={run_dir}"])


def finish(run_dir: Path, *extra: str) -> str:
    """Run the command to its end; its output."""
    proc = launch(run_dir, *extra)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


def final(run_dir: Path) -> dict:
    s = summary(run_dir)
    return {k: v for k, v in s.items() if k.startswith(("ppl_", "bpb_", "ce_")) or k in ("rho", "step", "status")}


def assert_as_reference(run_dir: Path, reference: Path) -> None:
    assert final(run_dir) == final(reference)
    assert rows(run_dir) == rows(reference)


def checkpoint_times(run_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").iterdir()}


def final_untouched(run_dir: Path, before: dict[str, int]) -> bool:
    """Nothing trained again: the final checkpoint is the one there before; the ones before it went when the
    run was recorded completed."""
    return checkpoint_times(run_dir) == {k: v for k, v in before.items() if k.startswith("step_0000020.")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_cache) -> Path:
    """The tiny run, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    finish(run_dir, "trainer.keep_final_optimizer=true")  # every checkpoint kept, as before its summary
    assert len(final(run_dir)) == 3 * 3 + 3  # ppl, bpb, ce of 3 validation sets; rho, step, status
    logged = [(r["kind"], r["step"]) for r in rows(run_dir)]
    assert len(logged) == len(set(logged)) and ("eval", 20) in logged
    return run_dir


def killed_copy(reference: Path, tmp_path: Path) -> Path:
    """The reference's folder as a process killed after its final checkpoint, before its final summary, left it
    (the checkpoints before the final one still there: a run deletes them once its summary says completed)."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    s = summary(run_dir)
    (run_dir / "summary.json").write_text(json.dumps({**s, "status": "running"}))
    return run_dir


def test_final_checkpoint_without_final_summary_completes_with_the_final_metrics(reference, tmp_path):
    run_dir = killed_copy(reference, tmp_path)
    before = checkpoint_times(run_dir)
    out = finish(run_dir)
    assert "resuming from step 20" in out
    assert_as_reference(run_dir, reference)
    assert summary(run_dir)["tokens_per_s"] == summary(reference)["tokens_per_s"]  # the last train row's
    assert final_untouched(run_dir, before)


def test_truncated_checkpoint_is_set_aside_and_the_one_before_resumes(reference, tmp_path):
    run_dir = killed_copy(reference, tmp_path)
    newest = run_dir / "checkpoints" / "step_0000020.pt"
    os.truncate(newest, 1000)
    out = finish(run_dir)
    assert "step_0000020.pt does not load" in out and "resuming from step 10" in out
    assert {"step_0000020.pt.corrupt", "step_0000020.json.corrupt"} <= set(checkpoint_times(run_dir))
    assert_as_reference(run_dir, reference)


def test_no_loadable_checkpoint_starts_from_the_seeds_state(reference, tmp_path):
    run_dir = killed_copy(reference, tmp_path)
    (run_dir / "checkpoints" / "step_0000020.pt").write_bytes(b"not a checkpoint")
    older = run_dir / "checkpoints" / "step_0000010.pt"
    state = torch.load(older, weights_only=True)
    state["model"] = {k: v + 1 for k, v in list(state["model"].items())[:-1]}  # a key short: loads half-way
    torch.save(state, older)
    trainer = Trainer(compose_config(TINY), run_dir)
    assert trainer._resume() == 0
    fresh = Trainer(compose_config(TINY), tmp_path / "fresh")
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), fresh.model.parameters(), strict=True))
    assert trainer.optimizer.state_dict() == fresh.optimizer.state_dict()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step_0000010.json.corrupt",
        "step_0000010.pt.corrupt",
        "step_0000020.json.corrupt",
        "step_0000020.pt.corrupt",
    ]


def test_damaged_source_checkpoint_fails_an_evaluate_run_in_one_line(reference, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(reference, source)
    os.truncate(source / "checkpoints" / "step_0000020.pt", 1000)
    before = checkpoint_times(source)
    cfg = compose_config([*TINY, "stage=variable_r", f"stage.source={source}", "stage.eval_n_loops=2"])
    with pytest.raises(ConfigError, match="step_0000020.pt is not the checkpoint its run saved.*relaunch the") as err:
        execute(cfg, tmp_path / "eval")
    assert "\n" not in str(err.value)
    assert checkpoint_times(source) == before  # the source run's files are left as they are


def test_torn_metrics_line_is_dropped_and_the_lost_eval_recomputed(reference, tmp_path):
    run_dir = killed_copy(reference, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[: len(text) - 40])  # the last row (the final eval) cut mid-write
    before = checkpoint_times(run_dir)
    out = finish(run_dir)
    assert "resuming from step 20" in out
    assert_as_reference(run_dir, reference)
    assert final_untouched(run_dir, before)


def test_unreadable_summary_resumes_from_the_checkpoints(reference, tmp_path):
    run_dir = killed_copy(reference, tmp_path)
    (run_dir / "summary.json").write_text('{"status": "runn')
    other = compose_config([*TINY, "trainer.lr=1e-3"])
    with pytest.raises(ConfigError, match="hydra.run.dir"):  # named by its config.yaml
        execute(other, run_dir)
    (run_dir / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="hydra.run.dir"):  # named by its checkpoints' meta
        execute(other, run_dir)
    before = checkpoint_times(run_dir)
    out = finish(run_dir)
    assert "resuming from step 20" in out
    assert_as_reference(run_dir, reference)
    assert final_untouched(run_dir, before)


def test_an_error_while_resuming_is_recorded(reference, tmp_path):
    run_dir = killed_copy(reference, tmp_path)
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "metrics.jsonl").mkdir()  # unreadable: the resume fails
    with pytest.raises(IsADirectoryError):
        execute(compose_config(TINY), run_dir)
    assert summary(run_dir)["status"] == "failed" and "IsADirectoryError" in summary(run_dir)["error"]
    assert "Traceback" in (run_dir / "error.log").read_text()


def wait_until(done, proc, what: str) -> None:
    deadline = time.time() + 120
    while not done():
        assert proc.poll() is None and time.time() < deadline, f"the run ended before {what}"
        time.sleep(0.05)


def test_one_process_owns_a_run_folder_until_it_dies(reference, tmp_path):
    busy = tmp_path / "busy"
    first = launch(busy)
    wait_until((busy / "checkpoints" / "step_0000010.json").exists, first, "its first checkpoint")
    first.send_signal(signal.SIGSTOP)  # held mid-run, so the second surely finds it training
    assert summary(busy)["status"] == "running"
    second = launch(busy)  # a relaunch racing the first, or a run started by hand into its folder
    out, _ = second.communicate(timeout=120)
    first.send_signal(signal.SIGCONT)
    assert second.returncode == 2
    assert out.splitlines() == [
        f"error: {busy} is in use by another process (pid {first.pid}); wait for it to end, "
        "or choose another folder with hydra.run.dir=DIR"
    ]
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    assert_as_reference(busy, reference)

    killed = tmp_path / "killed"
    owner = launch(killed)
    wait_until((killed / "checkpoints" / "step_0000010.json").exists, owner, "its first checkpoint")
    owner.kill()  # SIGKILL: no handler runs; the OS drops the lock with the process
    owner.wait()
    assert summary(killed)["status"] == "running"
    assert "resuming from step 10" in finish(killed)
    assert_as_reference(killed, reference)
