"""`python -m cart_sweeps.wandb_sync backfill stage=<name> [logger.* ...]`: W&B runs from a stage's run folders.

Each training run's W&B run is written through the live logger (train.logger.WandbLogger), so it is the same
run; each folder records what its W&B run holds (train.logger.Logged), so a backfill is idempotent and resumable.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.backfill import Backfill, backfill_stage, main_of, missing, write_rows
from cart_sweeps.compose import compose_config
from cart_sweeps.config import ConfigError
from cart_sweeps.naming import runs_of_named_stage
from cart_sweeps.train.logger import LOGGED, Logged, WandbLogger

USAGE = """usage: python -m cart_sweeps.wandb_sync backfill stage=<name> [OVERRIDE ...]

Writes a W&B run for each training run of the stage from its run folder (config, metrics, status), beside its
files (<runs>/<stage>/<run>/wandb/), offline unless logger.mode=online. Rerun it at any time: it writes only
what the W&B runs do not hold yet (nothing, for a stage backfilled since its last step). logger.project,
logger.entity and logger.mode say where the runs go, as for a launch.
  python -m cart_sweeps.wandb_sync backfill stage=1 scale=tiny                     # offline
  wandb sync runs/1/*/wandb/offline-run-*                                          # later, online
  python -m cart_sweeps.wandb_sync backfill stage=1 scale=tiny logger.mode=online  # or at once, after `wandb login`
"""

NEEDS_FREE = 1024 * 1024  # bytes free to start a run's W&B run (a 6-step tiny run's offline files: 48 KB)


def backfill_run(run_dir: Path, cfg: DictConfig, logger_cfg: DictConfig) -> int | None:
    """Write what the run's W&B run lacks of its folder; the rows written, or None where it holds them all."""
    cfg.logger = logger_cfg
    if (todo := missing(run_dir, cfg, LOGGED)) is None:
        return None
    before, rows, status = todo
    if before is not None and before.writing is not None:  # a backfill cut off while writing it
        shutil.rmtree(before.writing, ignore_errors=True)
    if (free := shutil.disk_usage(run_dir).free) < NEEDS_FREE:
        raise ConfigError(_full(run_dir, f"{free // 1024} KB free"))
    logger = WandbLogger(cfg, run_dir)
    try:
        done, was = (before.step, before.status) if before else (0, "")
        Logged(logger.id, done, was, writing=str(logger.folder)).write(run_dir)
        return write_rows(logger, rows, status)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        shutil.rmtree(logger.folder, ignore_errors=True)  # no half-written offline run is left behind
        raise ConfigError(_full(run_dir, err.strerror)) from err


def _full(run_dir: Path, why: str | None) -> str:
    return (
        f"backfill: the disk holding {run_dir} is full ({why}); free some space and run the backfill again: it "
        "writes this run again from where its W&B run stood, and the runs before it are done"
    )


def backfill(overrides: list[str]) -> Backfill:
    cfg = compose_config(overrides)
    stage_dir = runs_of_named_stage(cfg, "backfill")
    logger_cfg = cast(DictConfig, OmegaConf.merge(cfg.logger, {"name": "wandb"}))
    done = backfill_stage(stage_dir, lambda run_dir, run_cfg: backfill_run(run_dir, run_cfg, logger_cfg))
    print(done.said(cfg.stage.name, "W&B"))
    if done.written and cfg.logger.mode != "online":
        print(f"offline: sync with `wandb sync {stage_dir}/*/wandb/offline-run-*` after `wandb login`")
    return done


def main(argv: list[str] | None = None) -> None:
    main_of("cart_sweeps.wandb_sync", backfill, USAGE, argv)


if __name__ == "__main__":
    main()
