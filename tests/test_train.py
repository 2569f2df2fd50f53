"""One run end to end on the embedded corpus: real tiny models trained on the CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch
from stages import with_fault
from test_wandb import inspect

from cart_sweeps.bench import bench
from cart_sweeps.compose import compose_config
from cart_sweeps.config import ConfigError
from cart_sweeps.dashboard import build_report, build_workspace, dashboard
from cart_sweeps.identity import run_id
from cart_sweeps.metric import RHO_LABEL
from cart_sweeps.model import build_model
from cart_sweeps.run import execute
from cart_sweeps.schedule import Schedule
from cart_sweeps.train.logger import NOT_RECORDED, check_credentials, wandb_id
from cart_sweeps.train.setup import build_optimizer

TINY = ["scale=tiny", "trainer.steps=40", "trainer.eval_every=20", "trainer.ckpt_every=10", "trainer.log_every=5"]
# Timing fields differ between two runs of the same config; everything else must not.
TIMING = {"tokens_per_s", "mfu", "peak_mem_mb"}


def cli(args: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cart_sweeps", *args],
        env={**(env or os.environ), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def killed_at_checkpoint(args: list[str], run_dir: Path, step: int, timeout: float) -> None:
    """Start the single-run command `args`, SIGKILL it once its checkpoint at `step` is written, and see it left
    `running` (cut off, as a crash leaves it)."""
    proc, deadline = cli(args), time.time() + timeout
    while not (run_dir / "checkpoints" / f"step_{step:07d}.json").exists():
        assert proc.poll() is None and time.time() < deadline, f"the run ended before its checkpoint at step {step}"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert summary(run_dir)["status"] == "running"


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_cache) -> Path:
    """One tiny CART run, trained to the end (in-process), shared by the read-only checks."""
    run_dir = tmp_path_factory.mktemp("run")
    from cart_sweeps.compose import compose_config

    execute(compose_config([*TINY, "trainer.deterministic=true"]), run_dir)
    return run_dir


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_loss_falls_and_the_run_folder_holds_everything(finished_run):
    train = [r for r in rows(finished_run) if r["kind"] == "train"]
    evals = [r for r in rows(finished_run) if r["kind"] == "eval"]
    assert [r["step"] for r in train] == list(range(5, 41, 5))
    assert train[-1]["loss"] < train[0]["loss"] - 0.5
    assert [r["step"] for r in evals] == [20, 40]
    assert all(0.5 < r["rho"] < 1.0 for r in train)
    s = summary(finished_run)
    assert s["status"] == "completed" and s["step"] == 40
    ppl_keys = sorted(k for k in s if k.startswith("ppl_"))
    assert len(ppl_keys) == 3 and all(f"bpb_{k[4:]}" in s for k in ppl_keys)
    assert s["params_stored"] == sum(p.numel() for p in build_model_from(finished_run).parameters())
    assert s["params_effective"] > s["params_stored"]
    for key in ("rho", "tokens_per_s", "wall_time_s", "env", "run_id", "label"):
        assert s[key] is not None, key
    assert s["env"]["packages"]["torch"] == metadata.version("torch") and s["env"]["device"]
    assert (finished_run / "config.yaml").exists()
    meta = json.loads((finished_run / "checkpoints" / "step_0000040.json").read_text())
    assert meta["step"] == 40 and meta["run_id"] == s["run_id"]


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_finished_run_keeps_its_final_weights_alone(finished_run, tmp_path):
    """No optimizer state and no earlier checkpoint: the folder is at most 1.5x its weights, plus its logs;
    trainer.keep_final_optimizer=true keeps both, for a run meant to train further."""
    (final,) = (finished_run / "checkpoints").glob("*.pt")
    state = torch.load(final, weights_only=True)
    assert final.name == "step_0000040.pt" and sorted(state) == ["model", "rng", "step"]
    weights = sum(t.numel() * t.element_size() for t in state["model"].values())
    logs = sum(p.stat().st_size for p in finished_run.iterdir() if p.is_file())
    held = sum(p.stat().st_size for p in finished_run.rglob("*") if p.is_file())
    assert held - logs <= 1.5 * weights
    kept, keeping = tmp_path / "kept", [*TINY, "trainer.deterministic=true", "trainer.keep_final_optimizer=true"]
    execute(compose_config([*keeping, "trainer.steps=20"]), kept)  # half the length: the same checkpoints' rule
    assert sorted(p.name for p in (kept / "checkpoints").glob("*.pt")) == ["step_0000010.pt", "step_0000020.pt"]
    assert "optimizer" in torch.load(kept / "checkpoints" / "step_0000020.pt", weights_only=True)
    assert run_id(compose_config(keeping)) == summary(finished_run)["run_id"]  # keeping them is not another run


def build_model_from(run_dir: Path):
    from omegaconf import OmegaConf

    return build_model(OmegaConf.load(run_dir / "config.yaml").model)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(tmp_path, data_cache, finished_run):
    """SIGKILL mid-run, relaunch the same command: same rows, no duplicates, no gaps, same final metrics."""
    run_dir = tmp_path / "killed"
    args = [*TINY, "trainer.deterministic=true", f"hydra.run.dir={run_dir}"]
    killed_at_checkpoint(args, run_dir, 20, 120)
    out, _ = cli(args).communicate(timeout=300)
    assert "resuming from step" in out
    assert rows(run_dir) == rows(finished_run)
    final = {k: v for k, v in summary(finished_run).items() if k.startswith(("ppl_", "bpb_", "ce_")) or k == "rho"}
    assert {k: summary(run_dir)[k] for k in final} == final


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_ctrl_c_python_swallows_stops_a_single_run_at_its_next_step(tmp_path, data_cache):
    """The single-run command keeps a Ctrl-C that Python dropped (cart_sweeps.interrupt), as a stage's runs do
    (test_workers.py): the run records itself interrupted after the step it was in."""
    run_dir = tmp_path / "run"
    args = ["scale=tiny", "trainer.steps=20", "trainer.log_every=1", f"hydra.run.dir={run_dir}"]
    out, _ = cli(args, env=with_fault(tmp_path, "step:lost-sigint:3", tmp_path / "mark")).communicate(timeout=300)
    assert "Exception ignored" in out and summary(run_dir)["status"] == "interrupted"
    assert [row["step"] for row in rows(run_dir) if row["kind"] == "train"] == [1, 2, 3]


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_finished_run_relaunched_does_nothing(finished_run):
    before = (finished_run / "summary.json").stat().st_mtime_ns
    from cart_sweeps.compose import compose_config

    result = execute(compose_config([*TINY, "trainer.deterministic=true"]), finished_run)
    assert result.status == "completed"
    assert (finished_run / "summary.json").stat().st_mtime_ns == before


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_another_config_in_a_used_folder_is_refused(finished_run, capsys):
    from cart_sweeps.compose import compose_config
    from cart_sweeps.config import ConfigError

    with pytest.raises(ConfigError, match="hydra.run.dir"):
        execute(compose_config([*TINY, "trainer.lr=1e-3"]), finished_run)


@pytest.mark.slow
def test_huge_lr_ends_diverged_with_one_line(tmp_path, data_cache):
    run_dir = tmp_path / "diverged"
    proc = cli([*TINY, "trainer.lr=1e6", "trainer.warmup_steps=1", f"hydra.run.dir={run_dir}"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "diverged" in out and "trainer.lr" in out
    assert summary(run_dir)["status"] == "diverged"


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("model.d_model=50", "model.d_model=50 must be a positive multiple of model.head_dim=16"),
        ("+model.n_loop=4", "+model.n_loop: model has no such setting; did you mean model.n_loops?"),
        ("+model.xyz=4", "+model.xyz: model has no such setting; check its spelling (no + to set one)"),
    ],
)
def test_bad_override_is_one_line_before_anything_runs(tmp_path, bad, says):
    proc = cli(["scale=tiny", bad, f"hydra.run.dir={tmp_path / 'bad'}"])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert out.strip().splitlines() == [f"error: {says}"]
    assert not (tmp_path / "bad" / "summary.json").exists()


@pytest.mark.slow
def test_wandb_offline_run_holds_loss_and_rho(tmp_path, data_cache):
    import wandb

    from cart_sweeps.compose import compose_config

    run_dir = tmp_path / "wandb-run"
    execute(compose_config([*TINY, "trainer.steps=10", "logger=wandb"]), run_dir)
    wandb.teardown()  # finish() returns before wandb-core has closed the run's .wandb log
    [offline_run] = run_dir.glob("wandb/offline-run-*")
    records = inspect(offline_run)
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert {"train/loss", "rho", "step"} <= set().union(*history)
    assert "train/mfu" not in set().union(*history)  # no MFU on the CPU: left out, not logged as null
    assert all(value != "null" for row in history for value in row.values())
    assert offline_run.name.endswith(f"-single-{run_id(compose_config([*TINY, 'trainer.steps=10']))}")
    steps = [int(row["step"]) for row in history]
    assert steps == sorted(steps) and steps[-1] == 10
    [run] = [r["run"] for r in records if r["type"] == "run"]
    assert run["job_type"] == "single" and {"stage-single", "scale-tiny"} <= set(run["tags"])
    config = set(run["config"]["update"])
    assert {"model", "trainer", "data", "stage", "scale", "seed"} <= config and not config & set(NOT_RECORDED)
    best = {r["metric"].get("name"): r["metric"].get("summary") for r in records if r["type"] == "metric"}
    assert best["val/ppl_austen"] == best["val/bpb_austen"] == {"min": True, "last": True}


def test_wandb_id_is_one_per_stage_and_run(compose):
    """The run id hashes the configuration alone: the same configuration in two stages gets two W&B runs (their
    resumed syncs would merge otherwise), and a relaunch composes the same id, so a resumed run continues."""
    first = compose(["scale=tiny", "stage=1"])
    second = compose(["scale=tiny", "stage=1"])
    second.stage.name = "2"
    assert run_id(first) == run_id(second) and wandb_id(first) != wandb_id(second)
    assert wandb_id(first) == wandb_id(compose(["scale=tiny", "stage=1"])) == f"1-{run_id(first)}"


def test_decay_all_false_spares_gate_hc_norms_and_lie(compose):
    cfg = compose(["scale=tiny", "trainer.decay_all=false"])
    model = build_model(cfg.model)
    decayed, spared = build_optimizer(model, cfg.trainer, torch.device("cpu")).param_groups
    assert decayed["weight_decay"] == 0.1 and spared["weight_decay"] == 0.0
    assert {"gate", "hc_logits"} <= set(spared["names"])
    assert any("lie" in n for n in spared["names"]) and any("norm" in n for n in spared["names"])
    assert not any("norm" in n or n == "gate" for n in decayed["names"])
    paper = build_optimizer(model, compose(["scale=tiny"]).trainer, torch.device("cpu")).param_groups
    assert len(paper) == 1 and paper[0]["weight_decay"] == 0.1


def test_lr_schedule_warms_up_then_anneals_to_min(compose):
    t = compose([]).trainer
    lr_at = Schedule.of(t).lr_at
    assert lr_at(0) == pytest.approx(3e-6)
    assert lr_at(99) == pytest.approx(3e-4)
    assert lr_at(t.steps) == pytest.approx(3e-5)
    assert lr_at(t.steps // 2) < 3e-4


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_bench_prints_the_figures(capsys):
    result = bench(["scale=tiny", "bench.warmup=1", "bench.steps=2"])
    assert result["tokens_per_s"] > 0 and result["ms_per_step"] > 0
    assert result["device"] == "cpu" and result["mfu"] is None and result["dtype"] == "float32"
    assert result["batch_size"] == 8 and result["seq_len"] == 64


@pytest.mark.slow  # W&B workspace and report objects built offline
def test_dashboard_offline_prints_the_workspace_it_would_create(compose, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))  # it writes its spec file into the stage's folder
    assert dashboard(["stage=1", "scale=tiny"]) == tmp_path / "1" / "wandb_dashboard.json"
    out = capsys.readouterr().out
    assert "train/loss" in out and "rho" in out and "not saved" in out
    assert "train/lr" in out and "train/tokens_per_s" in out and "val/bpb_austen" in out and "W&B report" in out
    cfg = compose(["stage=1", "scale=tiny"])
    workspace = build_workspace(cfg, entity="someone")
    assert [s.name for s in workspace.sections] == [
        "Training",
        "Learning rate",
        "Throughput",
        "Validation perplexity",
        "Validation bits per byte",
        RHO_LABEL,
    ]


def test_dashboard_report_carries_the_stage_tables(compose):
    """The report object, built offline as `logger.mode=online` would save it: panels, then each table."""
    from cart_sweeps.analysis.load import load_csv
    from cart_sweeps.analysis.render import markdown
    from cart_sweeps.analysis.tables import stage1_best, stage1_grid

    final = load_csv(Path(__file__).parent / "fixtures" / "paper_results.csv").final()
    tables = {"stage1_grid": stage1_grid(final, "ppl_wiki"), "stage1_best": stage1_best(final, "ppl_wiki")}
    report = build_report(compose(["stage=1", "scale=tiny"]), "someone", tables)
    grid, *rest = report.blocks
    assert report.title == "CART stage 1 (tiny)" and report.entity == "someone"
    assert {p.title for p in grid.panels} >= {"train/lr", "train/tokens_per_s", "val/bpb_austen", "val/ppl_austen"}
    assert [type(b).__name__ for b in rest] == ["H2", "MarkdownBlock"] * 2
    assert rest[1].text == markdown(tables["stage1_grid"]) and "185.7" in rest[1].text


def test_online_logging_accepts_wandb_login_netrc(compose, tmp_path, monkeypatch):
    """`wandb login` writes a netrc entry for the W&B host; that is a login as good as WANDB_API_KEY."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    online = compose(["scale=tiny", "logger=wandb", "logger.mode=online"]).logger
    with pytest.raises(ConfigError, match="needs a W&B login"):
        check_credentials(online)
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")
    check_credentials(online)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    with pytest.raises(ConfigError, match="needs a W&B login"):
        check_credentials(online)  # a login for another host is not one for this one
