"""What the two backfills share (W&B: wandb_sync, TensorBoard: tensorboard_sync): a stage's training run folders,
each left alone while a process trains it and claimed while one backfill writes it, so two backfills at once write
each run once; and when each of a run's rows was logged, from the run's own timing."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from filelock import FileLock, Timeout
from omegaconf import DictConfig, OmegaConf

from cart_sweeps.compose import run_cli
from cart_sweeps.identity import run_id
from cart_sweeps.naming import run_folder, run_label
from cart_sweeps.options import StageKind
from cart_sweeps.record.metrics import read_metrics
from cart_sweeps.record.runfolder import CONFIG, METRICS, RunFolderBusy, owned, read_summary
from cart_sweeps.status import RunStatus
from cart_sweeps.train.logger import Logged, Logger, wandb_id

CLAIM = ".backfill.lock"  # a run folder's backfill claim (its training holds the folder's own lock)

# Writes what a run's dashboard lacks of its folder: the rows written, or None where it holds them all.
WriteRun = Callable[[Path, DictConfig], int | None]


@dataclass
class Backfill:
    written: dict[str, int] = field(default_factory=dict)  # run folder -> rows written
    current: list[str] = field(default_factory=list)  # the dashboard already holds every row and the status
    running: list[str] = field(default_factory=list)  # a process trains it now: backfilled once it ends
    claimed: list[str] = field(default_factory=list)  # another backfill writes it now: written once, by that one

    def said(self, stage: str, where: str) -> str:
        return (
            f"backfill stage {stage}: {len(self.written)} runs written ({sum(self.written.values())} rows), "
            f"{len(self.current)} already in {where}, {len(self.running)} still running"
            + (f", {len(self.claimed)} written by another backfill now" if self.claimed else "")
        )


def training_runs(stage_dir: Path) -> list[tuple[Path, DictConfig]]:
    """The stage's own training run folders and their configs (not a copy `RUN.bak`, nor an evaluation)."""
    runs = []
    for run_dir in sorted(p for p in stage_dir.iterdir() if p.is_dir()):
        if not ((run_dir / CONFIG).is_file() and (run_dir / METRICS).is_file()):
            continue
        cfg = cast(DictConfig, OmegaConf.load(run_dir / CONFIG))
        if StageKind.of(cfg).trains and run_dir == run_folder(stage_dir, run_label(cfg), run_id(cfg)):
            runs.append((run_dir, cfg))
    return runs


def is_owned(run_dir: Path) -> bool:
    """Whether a process trains the run now (it owns the folder): its rows and status are not final yet."""
    try:
        with owned(run_dir):
            return False
    except RunFolderBusy:
        return True


def run_status(run_dir: Path) -> str:
    """How the run ended as its summary says; a run left `running` by a process that is gone was cut off."""
    summary = read_summary(run_dir)
    status = summary.status if summary is not None else RunStatus.RUNNING
    return str(RunStatus.INTERRUPTED if status == RunStatus.RUNNING else status)


def backfill_stage(stage_dir: Path, write: WriteRun) -> Backfill:
    done = Backfill()
    for run_dir, run_cfg in training_runs(stage_dir):
        if is_owned(run_dir):
            done.running.append(run_dir.name)
            continue
        try:  # the run's claim, released when this process ends (kill -9 too): one backfill writes it at a time
            claim = FileLock(run_dir / CLAIM).acquire(timeout=0)
        except Timeout:
            done.claimed.append(run_dir.name)
            continue
        with claim:
            written = write(run_dir, run_cfg)
        if written is None:
            done.current.append(run_dir.name)
        else:
            done.written[run_dir.name] = written
    return done


def logged_at(run_dir: Path, rows: list[dict[str, Any]], cfg: DictConfig) -> list[float]:
    """When each row was logged (Unix time), from the run's own timing: each train row's throughput is measured
    over the time since the row before it (tokens / tokens_per_s: its steps, evaluations and checkpoints), summed
    from the Unix time its training began (summary.json's first_step_at; where a summary lacks it, the time
    metrics.jsonl was last written, less the run's summed time). An eval row takes its step's train row's time."""
    elapsed, since, times = 0.0, 0.0, []
    before = None  # the previous train row
    for row in rows:
        if row.get("kind") == "train" and row.get("tokens_per_s"):
            steps = row["step"] - before["step"] if before else min(row["step"], cfg.trainer.log_every)
            tokens = row["tokens"] - before["tokens"] if before else row["tokens"] / row["step"] * steps
            elapsed += tokens / row["tokens_per_s"]
            before = row
        times.append(elapsed)
    summary = read_summary(run_dir)
    if summary is not None and summary.first_step_at is not None:
        since = summary.first_step_at
    else:
        since = (run_dir / METRICS).stat().st_mtime - elapsed
    return [since + t for t in times]


Rows = list[tuple[dict[str, Any], float]]  # metrics.jsonl rows, each with when it was logged (Unix time)


def missing(run_dir: Path, cfg: DictConfig, where: Path) -> tuple[Logged | None, Rows, str] | None:
    """What the dashboard recording itself at `where` in the run folder lacks of it: its record (None: nothing of
    this run), the rows past it and how the run ended; None where it holds them all."""
    rows, status = read_metrics(run_dir / METRICS), run_status(run_dir)
    before = Logged.read(run_dir, where)
    if before is not None and before.id != wandb_id(cfg):
        before = None  # another config's record (the folder was reused): it holds nothing of this run yet
    if before is not None and before.writing is None and before.status == status:
        if before.step >= max((row["step"] for row in rows), default=0):
            return None
    done = before.step if before is not None else 0
    at = logged_at(run_dir, rows, cfg)
    return before, [(row, t) for row, t in zip(rows, at, strict=True) if row["step"] > done], status


def write_rows(logger: Logger, rows: Rows, status: str) -> int:
    """Log `rows` at their own times, then the run's ending; how many rows."""
    for row, at in rows:
        logger.log(row, row["step"], at)
    logger.finish(status)
    return len(rows)


def main_of(module: str, backfill: Callable[[list[str]], Backfill], usage: str, argv: list[str] | None) -> None:
    """`python -m <module> backfill stage=<name> [OVERRIDE ...]`, the one thing a backfill command does."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["backfill"]:
        run_cli(backfill, usage, args[1:])
    elif {"-h", "--help"} & set(args):
        print(usage)
    else:
        print(f"error: say what to do: python -m {module} backfill stage=<name>", file=sys.stderr)
        sys.exit(2)
