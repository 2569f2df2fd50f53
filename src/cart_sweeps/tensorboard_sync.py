"""`python -m cart_sweeps.tensorboard_sync backfill stage=<name>`: TensorBoard event files from a stage's run folders.

Each run's events are written through the live logger (train.tensorboard.TensorBoardLogger), so a backfilled run
reads as one logged while training, each row at the time it was logged; each folder records what its events hold
(tensorboard.json), so a second backfill writes nothing and a run trained further since gets only its new rows.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from cart_sweeps.backfill import Backfill, backfill_stage, main_of, missing, write_rows
from cart_sweeps.compose import compose_config
from cart_sweeps.naming import runs_of_named_stage
from cart_sweeps.train.logger import TB_LOGGED
from cart_sweeps.train.tensorboard import TensorBoardLogger

USAGE = """usage: python -m cart_sweeps.tensorboard_sync backfill stage=<name> [OVERRIDE ...]

Writes TensorBoard event files for each training run of the stage from its run folder (its metrics.jsonl, each
row at the time the run logged it), into the folder, as logger=tensorboard does while training. Rerun it at any
time: it writes only what the event files do not hold yet. Then view the stage:
  python -m cart_sweeps.tensorboard_sync backfill stage=1 scale=tiny
  tensorboard --logdir runs/1                       # http://localhost:6006/
"""


def backfill_run(run_dir: Path, cfg: DictConfig) -> int | None:
    """Write what the run's event files lack of its folder; the rows written, or None where they hold them all."""
    if (todo := missing(run_dir, cfg, TB_LOGGED)) is None:
        return None
    _, rows, status = todo
    return write_rows(TensorBoardLogger(cfg, run_dir), rows, status)


def backfill(overrides: list[str]) -> Backfill:
    cfg = compose_config(overrides)
    stage_dir = runs_of_named_stage(cfg, "backfill")
    done = backfill_stage(stage_dir, backfill_run)
    print(done.said(cfg.stage.name, "TensorBoard"))
    print(f"view: tensorboard --logdir {stage_dir}")
    return done


def main(argv: list[str] | None = None) -> None:
    main_of("cart_sweeps.tensorboard_sync", backfill, USAGE, argv)


if __name__ == "__main__":
    main()
