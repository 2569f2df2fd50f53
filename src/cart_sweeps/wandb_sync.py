"""`python -m cart_sweeps.wandb_sync backfill stage=<name> [logger.* ...]`: W&B runs from a stage's run folders.

Each training run's W&B run is written through the live logger (train.logger.WandbLogger), so it is the same
run; each folder records what its W&B run holds (train.logger.Logged), so a backfill is idempotent and resumable.
"""

from __future__ import annotations

import errno
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from filelock import FileLock, Timeout
from omegaconf import DictConfig, OmegaConf

from cart_sweeps.compose import compose_config, run_cli
from cart_sweeps.config import ConfigError
from cart_sweeps.identity import run_id
from cart_sweeps.naming import run_folder, run_label, runs_of_named_stage
from cart_sweeps.options import StageKind
from cart_sweeps.record.metrics import read_metrics
from cart_sweeps.record.runfolder import METRICS, RunFolderBusy, owned, read_summary
from cart_sweeps.status import RunStatus
from cart_sweeps.train.logger import Logged, WandbLogger, wandb_id

USAGE = """usage: python -m cart_sweeps.wandb_sync backfill stage=<name> [OVERRIDE ...]

Writes a W&B run for each training run of the stage from its run folder (config, metrics, status), beside its
files (<runs>/<stage>/<run>/wandb/), offline unless logger.mode=online. Rerun it at any time: it writes only
what the W&B runs do not hold yet (nothing, for a stage backfilled since its last step). logger.project,
logger.entity and logger.mode say where the runs go, as for a launch.
  python -m cart_sweeps.wandb_sync backfill stage=1 scale=tiny                     # offline
  wandb sync runs/1/*/wandb/offline-run-*                                          # later, online
  python -m cart_sweeps.wandb_sync backfill stage=1 scale=tiny logger.mode=online  # or at once, after `wandb login`
"""

CLAIM = ".backfill.lock"  # a run folder's backfill claim (its training holds the folder's own lock)
NEEDS_FREE = 1024 * 1024  # bytes free to start a run's W&B run (a 6-step tiny run's offline files: 48 KB)


@dataclass
class Backfill:
    written: dict[str, int] = field(default_factory=dict)  # run folder -> rows written
    current: list[str] = field(default_factory=list)  # W&B already holds every row and the status
    running: list[str] = field(default_factory=list)  # a process trains it now: backfilled once it ends
    claimed: list[str] = field(default_factory=list)  # another backfill writes it now: written once, by that one


def training_runs(stage_dir: Path) -> list[tuple[Path, DictConfig]]:
    """The stage's own training run folders and their configs (not a copy `RUN.bak`, nor an evaluation)."""
    runs = []
    for run_dir in sorted(p for p in stage_dir.iterdir() if p.is_dir()):
        if not ((run_dir / "config.yaml").is_file() and (run_dir / METRICS).is_file()):
            continue
        cfg = cast(DictConfig, OmegaConf.load(run_dir / "config.yaml"))
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


def backfill_run(run_dir: Path, cfg: DictConfig, logger_cfg: DictConfig) -> int | None:
    """Write what the run's W&B run lacks of its folder; the rows written, or None where it holds them all."""
    cfg.logger = logger_cfg
    rows, status, id_ = read_metrics(run_dir / METRICS), run_status(run_dir), wandb_id(cfg)
    last = max((row["step"] for row in rows), default=0)
    before = Logged.read(run_dir)
    if before is not None and before.id != id_:
        before = None  # another config's record (the folder was reused): this run's W&B run holds nothing yet
    if before is not None and before.writing is not None:  # a backfill cut off while writing it
        shutil.rmtree(before.writing, ignore_errors=True)
    if before is not None and before.writing is None and before.step >= last and before.status == status:
        return None
    done = before.step if before is not None else 0
    if (free := shutil.disk_usage(run_dir).free) < NEEDS_FREE:
        raise ConfigError(_full(run_dir, f"{free // 1024} KB free"))
    logger = WandbLogger(cfg, run_dir)
    try:
        Logged(id_, done, before.status if before else "", writing=str(logger.folder)).write(run_dir)
        new = [row for row in rows if row["step"] > done]
        for row in new:
            logger.log(row, row["step"])
        logger.finish(status)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        shutil.rmtree(logger.folder, ignore_errors=True)  # no half-written offline run is left behind
        raise ConfigError(_full(run_dir, err.strerror)) from err
    return len(new)


def _full(run_dir: Path, why: str | None) -> str:
    return (
        f"backfill: the disk holding {run_dir} is full ({why}); free some space and run the backfill again: it "
        "writes this run again from where its W&B run stood, and the runs before it are done"
    )


def backfill(overrides: list[str]) -> Backfill:
    cfg = compose_config(overrides)
    stage_dir = runs_of_named_stage(cfg, "backfill")
    logger_cfg = OmegaConf.merge(cfg.logger, {"name": "wandb"})
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
            written = backfill_run(run_dir, run_cfg, cast(DictConfig, logger_cfg))
        if written is None:
            done.current.append(run_dir.name)
        else:
            done.written[run_dir.name] = written
    print(
        f"backfill stage {cfg.stage.name}: {len(done.written)} runs written ({sum(done.written.values())} rows), "
        f"{len(done.current)} already in W&B, {len(done.running)} still running"
        + (f", {len(done.claimed)} written by another backfill now" if done.claimed else "")
    )
    if done.written and cfg.logger.mode != "online":
        print(f"offline: sync with `wandb sync {stage_dir}/*/wandb/offline-run-*` after `wandb login`")
    return done


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["backfill"]:
        run_cli(backfill, USAGE, args[1:])
    elif {"-h", "--help"} & set(args):
        print(USAGE)
    else:
        print("error: say what to do: python -m cart_sweeps.wandb_sync backfill stage=<name>", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
