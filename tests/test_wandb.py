"""W&B as users expect: the logging choice is no part of a run's identity, a stage trained with `logger=none` is
backfilled from its run folders (offline, idempotent, finished on rerun after a kill), the dashboard writes its
spec offline, and tags follow the model.

Real parts: a real tiny stage (a CART and a dense run) launched by the real command, real W&B offline runs read
back with `wandb leet inspect --json`, a real SIGKILL of the backfill at an exact point.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from stages import FAULTS, dated_by_hand, env, small_disk, sweep

from cart_sweeps.identity import config_id, run_id
from cart_sweeps.naming import run_dir, run_label
from cart_sweeps.record.metrics import read_metrics
from cart_sweeps.train.logger import wandb_metrics, wandb_tags

REPO = Path(__file__).parents[1]
TINY = ["scale=tiny", "trainer.steps=6", "trainer.eval_every=3", "trainer.log_every=2"]
STAGE = """\
name: mine
grid:
  model: [cart, dense]
recipe:
  seed: 42
"""
PATH = [p for p in [os.environ.get("PYTHONPATH", "")] if p]
LOGGERS = [
    [],
    ["logger=none"],
    ["logger=wandb"],
    ["logger=wandb", "logger.mode=online", "logger.project=elsewhere"],
    ["logger=tensorboard"],
]


def command(runs: Path, module: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env(runs, **extra), capture_output=True, text=True, cwd=REPO
    )


def backfill(base: Path, runs: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    args = ("backfill", "--config-dir", str(base / "cfg"), "stage=mine", *TINY)
    return command(runs, "cart_sweeps.wandb_sync", *args, **extra)


def inspect(offline_run: Path) -> list[dict]:
    """An offline W&B run's records, as W&B's own reader gives them."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(offline_run)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def history(records: list[dict]) -> dict[int, dict]:
    """W&B's history rows by step, W&B's own keys (_step, _runtime, ...) aside."""
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    return {int(row["step"]): {k: v for k, v in row.items() if not k.startswith("_")} for row in rows}


def expected(run: Path) -> dict[int, dict]:
    """The run folder's metrics.jsonl as W&B rows, by hand: one row per step, its train and eval rows merged."""
    out: dict[int, dict] = {}
    for row in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()):
        out.setdefault(row["step"], {"step": row["step"]})
        prefix = "val/" if row["kind"] == "eval" else "train/"
        for key, value in row.items():
            if key not in ("step", "kind") and value is not None:
                out[row["step"]]["rho" if key == "rho" else prefix + key] = value
    return out


def files(runs: Path) -> dict[str, int]:
    """Every file under the stage's W&B folders, with its size: what a backfill wrote."""
    return {str(p): p.stat().st_size for p in (runs / "mine").glob("*/wandb/**/*") if p.is_file()}


@pytest.fixture(scope="module")
def stage(tmp_path_factory, data_cache) -> tuple[Path, Path]:
    """The user's stage `mine` (a CART and a dense run), trained with the default logger=none."""
    base = tmp_path_factory.mktemp("wandb")
    (base / "cfg" / "stage").mkdir(parents=True)
    (base / "cfg" / "stage" / "mine.yaml").write_text(STAGE)
    runs = base / "runs"
    done = sweep(runs, "--config-dir", str(base / "cfg"), "stage=mine", *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list((runs / "mine").glob("*/wandb"))  # logger=none: no W&B run yet
    return base, runs


def test_the_logging_choice_is_no_part_of_a_run_identity(compose):
    """logger=none, wandb, online to another project, tensorboard: one run id, one config id, one folder, so
    turning a dashboard on later neither trains a run again nor gives it a second folder."""
    cfgs = [compose(["scale=tiny", "stage=1", *logger]) for logger in LOGGERS]
    assert len({run_id(c) for c in cfgs}) == len({config_id(c) for c in cfgs}) == len({run_dir(c) for c in cfgs}) == 1


def test_tags_follow_the_model_label(compose):
    """A dense run is tagged by its label's pieces (dense, d, L), never P or R; a CART run by d, P, R."""
    dense = compose(["scale=tiny", "model=dense"])
    assert run_label(dense).startswith("dense-d64-L4")
    tags = wandb_tags(dense)
    assert {"dense", "d64", "L4", "seed42", "stage-single", "scale-tiny"} <= set(tags)
    assert not [t for t in tags if t[0] in "PR" and t[1:].isdigit()] and len(tags) == len(set(tags))
    cart = wandb_tags(compose(["scale=tiny", "model=cart", "model.n_loops=3", "model.disable_lti=true"]))
    assert {"cart", "d64", "P2", "R3", "disable_lti"} <= set(cart) and "L4" not in cart


@pytest.mark.slow
def test_relaunch_with_wandb_on_trains_nothing_again(stage):
    base, runs = stage
    done = sweep(runs, "--config-dir", str(base / "cfg"), "stage=mine", *TINY, "logger=wandb")
    assert done.returncode == 0 and "2 done, skipped" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_backfill_writes_the_run_folders_metrics_once(stage):
    base, runs = stage
    done = backfill(base, runs)
    assert done.returncode == 0 and "2 runs written (10 rows)" in done.stdout, done.stdout + done.stderr
    folders = sorted(p for p in (runs / "mine").iterdir() if (p / "metrics.jsonl").is_file())
    for run in folders:
        [offline] = run.glob("wandb/offline-run-*")
        records = inspect(offline)
        assert history(records) == expected(run)  # every value, exactly: loss, validation PPL, rho
        items = [r["history"]["item"] for r in records if r["type"] == "history"]
        stamps = {int(item["step"]): item["_timestamp"] for item in items}
        assert stamps == pytest.approx(dated_by_hand(run), abs=1e-3)  # when the run logged it, not the backfill
        summary = json.loads((run / "summary.json").read_text())
        [meta] = [r["run"] for r in records if r["type"] == "run"]
        assert meta["run_id"] == f"mine-{summary['run_id']}" and meta["display_name"] == summary["label"]
        tags = set(meta["tags"])
        if summary["model"]["name"] == "dense":
            assert {"dense", "d64", "L4"} <= tags and not tags & {"P2", "R4"}
            assert "rho" not in set().union(*history(records).values())  # null for a dense model: left out
        else:
            assert {"cart", "d64", "P2", "R4"} <= tags
        assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]
    before = files(runs)
    again = backfill(base, runs)
    assert again.returncode == 0 and "0 runs written (0 rows), 2 already in W&B" in again.stdout, again.stdout
    assert files(runs) == before  # nothing new, nothing rewritten


KILL_AT = """\
import os, signal
import wandb.sdk.wandb_run as wandb_run

_log, _calls = wandb_run.Run.log, [0]


def log(self, *args, **kwargs):
    _calls[0] += 1
    if _calls[0] == int(os.environ["KILL_AT_LOG"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return _log(self, *args, **kwargs)


wandb_run.Run.log = log
"""


@pytest.mark.slow
def test_two_backfills_at_once_write_each_run_once(stage, tmp_path):
    """Two concurrent backfills of one stage wrote 34 offline runs for 18 and doubled their history, both exiting
    0 (issue 48, item 6): each run is claimed by the backfill that writes it, the other says so and skips it."""
    base, trained = stage
    runs = tmp_path / "runs"
    shutil.copytree(trained / "mine", runs / "mine", ignore=shutil.ignore_patterns("wandb"), symlinks=True)
    args = [sys.executable, "-m", "cart_sweeps.wandb_sync", "backfill", "--config-dir", str(base / "cfg"), "stage=mine"]
    both = [
        subprocess.Popen([*args, *TINY], env=env(runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    said = [p.communicate(timeout=600) for p in both]
    assert [p.returncode for p in both] == [0, 0], said
    for run in sorted(p for p in (runs / "mine").iterdir() if (p / "metrics.jsonl").is_file()):
        [offline] = run.glob("wandb/offline-run-*")  # one W&B run each, whichever backfill wrote it
        assert history(inspect(offline)) == expected(run)
    again = backfill(base, runs)
    assert "0 runs written (0 rows), 2 already in W&B" in again.stdout, again.stdout


@pytest.mark.slow
def test_a_backfill_on_a_full_disk_is_one_line_and_leaves_no_empty_w_and_b_run(stage, tmp_path):
    """It printed hundreds of lines of W&B's logging tracebacks and left an empty offline run per attempt."""
    base, trained = stage
    with small_disk(tmp_path / "disk", "64m") as disk:
        runs = disk / "runs"
        shutil.copytree(trained / "mine", runs / "mine", ignore=shutil.ignore_patterns("wandb"), symlinks=True)
        filler = disk / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as f:
            while True:  # until the disk is full
                f.write(b"\0" * 65536)
                f.flush()
        full = backfill(base, runs)
        assert full.returncode == 2 and full.stderr.count("\n") == 1, full.stderr[-3000:]
        assert full.stderr.startswith("error: backfill: the disk holding ") and "is full (" in full.stderr
        assert not list((runs / "mine").glob("*/wandb/offline-run-*"))
        filler.unlink()
        done = backfill(base, runs)
        assert done.returncode == 0 and "2 runs written (10 rows)" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_a_backfill_killed_halfway_finishes_on_rerun(stage, tmp_path):
    base, trained = stage
    runs = tmp_path / "runs"
    shutil.copytree(trained / "mine", runs / "mine", ignore=shutil.ignore_patterns("wandb"), symlinks=True)
    (tmp_path / "kill" / "sitecustomize.py").parent.mkdir()
    (tmp_path / "kill" / "sitecustomize.py").write_text(KILL_AT)
    path = os.pathsep.join([str(tmp_path / "kill"), os.environ.get("PYTHONPATH", "")])
    killed = backfill(base, runs, PYTHONPATH=path, KILL_AT_LOG="3")  # in the first run, after two of its rows
    assert killed.returncode == -9, killed.stdout + killed.stderr
    [first, second] = sorted(p for p in (runs / "mine").iterdir() if (p / "metrics.jsonl").is_file())
    assert json.loads((first / "wandb" / "logged.json").read_text())["writing"]  # cut off while writing it
    assert not (second / "wandb").exists()
    done = backfill(base, runs)
    assert done.returncode == 0 and "2 runs written (10 rows)" in done.stdout, done.stdout + done.stderr
    for run in (first, second):
        [offline] = run.glob("wandb/offline-run-*")  # the cut-off one is gone, written again whole
        assert history(inspect(offline)) == expected(run)
        assert json.loads((run / "wandb" / "logged.json").read_text())["writing"] is None
    again = backfill(base, runs)
    assert "0 runs written (0 rows), 2 already in W&B" in again.stdout, again.stdout


@pytest.mark.slow
def test_dashboard_writes_its_spec_offline_naming_the_logged_metrics(stage):
    base, runs = stage
    done = command(runs, "cart_sweeps.dashboard", "--config-dir", str(base / "cfg"), "stage=mine", *TINY)
    assert done.returncode == 0 and "not saved to W&B (offline)" in done.stdout, done.stdout + done.stderr
    spec = json.loads((runs / "mine" / "wandb_dashboard.json").read_text())
    logged = {
        key
        for run in (runs / "mine").glob("*/metrics.jsonl")
        for row in read_metrics(run)
        for key in wandb_metrics(row)
    }
    panels = [key for keys in spec["workspace"]["sections"].values() for key in keys]
    assert {"train/loss", "rho", "val/ppl_austen"} <= set(panels) <= logged  # every panel plots a logged metric
    assert spec["report"]["panels"] == panels and spec["entity"] is None
    assert spec["workspace"]["runs"] == {"filter": {"config.stage.name": "mine"}, "groupby": ["config.model.name"]}
    assert "| cart |" in spec["report"]["tables"]["runs_mine"] and "| dense |" in spec["report"]["tables"]["runs_mine"]


TIMING = {"train/tokens_per_s"}  # differs between two trainings of the same steps; nothing else may


def untimed(rows: dict[int, dict]) -> dict[int, dict]:
    return {step: {k: v for k, v in row.items() if k not in TIMING} for step, row in rows.items()}


@pytest.mark.slow
def test_a_run_trained_further_adds_only_its_new_rows(stage, tmp_path):
    """A run that failed at step 5 is backfilled as failed with its rows so far; relaunched, it completes, and the
    next backfill adds its later rows to the same W&B run (resumed): together they hold the whole record."""
    base, _ = stage
    runs = tmp_path / "runs"
    args = ("--config-dir", str(base / "cfg"), "stage=mine", *TINY, "trainer.ckpt_every=100", "sweep.max_retries=0")
    failed = sweep(runs, *args, CART_FAULT="step:raise:5:d64-P2", PYTHONPATH=os.pathsep.join([str(FAULTS), *PATH]))
    assert "1 completed, 1 failed" in failed.stdout + failed.stderr, failed.stdout + failed.stderr
    [cart] = (runs / "mine").glob("d64-P2-R4-*")
    assert [row["step"] for row in read_metrics(cart / "metrics.jsonl")] == [2, 3, 4]
    first = backfill(base, runs)
    assert "2 runs written (8 rows)" in first.stdout, first.stdout + first.stderr
    [offline] = cart.glob("wandb/offline-run-*")
    assert [r["exit"]["exit_code"] for r in inspect(offline) if r["type"] == "exit"] == [1]
    done = sweep(runs, *args)
    assert "1 completed, 0 failed" in done.stdout + done.stderr, done.stdout + done.stderr
    more = backfill(base, runs)
    assert "1 runs written (2 rows), 1 already in W&B" in more.stdout, more.stdout + more.stderr
    parts = [inspect(p) for p in sorted(cart.glob("wandb/offline-run-*"))]
    assert len(parts) == 2 and {r["run"]["run_id"] for p in parts for r in p if r["type"] == "run"} == {
        f"mine-{json.loads((cart / 'summary.json').read_text())['run_id']}"
    }
    assert untimed(history(parts[0]) | history(parts[1])) == untimed(expected(cart))
    assert list(history(parts[1])) == [6]
