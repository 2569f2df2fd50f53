"""`logger=tensorboard`: TensorBoard event files in each run folder, written by torch's own SummaryWriter.

`tensorboard --logdir <runs>/<stage>` shows one TensorBoard run per run folder (its name: the folder's, the run's
label and id), with the W&B logger's keys as tags (train/loss, train/lr, train/tokens_per_s, val/ppl_<set>, rho)
and, as text, the W&B run's name, group and tags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import scalar

from cart_sweeps.metric import RHO_LABEL
from cart_sweeps.naming import run_label
from cart_sweeps.train.logger import TB_LOGGED, Logged, wandb_id, wandb_metrics, wandb_tags

DESCRIPTIONS = {"rho": RHO_LABEL}  # a tag's description on its TensorBoard card


class TensorBoardLogger:
    """The run's events from its first logged step on. Each process writes a new event file whose first event
    purges what an earlier one logged at or past that step (SummaryWriter's purge_step), so a resumed run, which
    logs again from its checkpoint, or a backfill written again after a cut-off, shows each step once."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        self.run_dir, self.id = run_dir, wandb_id(cfg)
        self.about = (
            f"name `{run_label(cfg)}`, group `stage-{cfg.stage.name}`, id `{self.id}`, "
            f"tags: {', '.join(f'`{t}`' for t in wandb_tags(cfg))}"
        )
        before = Logged.read(run_dir, TB_LOGGED)
        self.step = before.step if before is not None and before.id == self.id else 0
        self.writer: SummaryWriter | None = None

    def log(self, row: dict[str, Any], step: int, walltime: float | None = None) -> None:
        if self.writer is None:
            self.writer = SummaryWriter(str(self.run_dir), purge_step=step)
            self.writer.add_text("run", self.about, step, walltime)
        events = self.writer.file_writer
        assert events is not None  # SummaryWriter opens it as it starts
        for key, value in wandb_metrics(row).items():
            summary = scalar(key, value, new_style=True)  # new style: TensorBoard keeps its description
            summary.value[0].metadata.summary_description = DESCRIPTIONS.get(key, "")
            events.add_summary(summary, step, walltime)
        self.step = max(self.step, step)

    def finish(self, status: str) -> None:
        if self.writer is not None:
            self.writer.add_text("status", status, self.step)
            self.writer.close()
        Logged(self.id, self.step, status).write(self.run_dir, TB_LOGGED)
