"""Dashboards: W&B (offline unless asked for online) or a null logger with the same methods."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import ConfigError, run_id, run_label, variant


class NullLogger:
    """Stands in for W&B when `logger=none`: the trainer calls the same methods either way."""

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


class WandbLogger:
    """One W&B run per training run; the run id is the config hash, so a resumed run continues it."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        import wandb

        lg = cfg.logger
        check_credentials(lg)
        m = cfg.model
        self.wandb = wandb
        self.run = wandb.init(
            project=lg.project,
            entity=lg.entity,
            mode=lg.mode,  # explicit: an unset mode prompts for a login and waits forever
            dir=str(run_dir),
            id=run_id(cfg),
            resume="allow",
            group=f"stage-{cfg.stage.name}",
            name=run_label(cfg),
            tags=[f"d{m.d_model}", f"P{m.n_prelude}", f"R{m.n_loops}", m.name, variant(m), f"seed{cfg.seed}"],
            config=OmegaConf.to_container(cfg, resolve=True),
            settings=wandb.Settings(silent=True, console="off"),
        )
        self.run.define_metric("step")
        for key in ("train/*", "val/*", "rho"):
            self.run.define_metric(key, step_metric="step")

    def log(self, row: dict[str, Any], step: int) -> None:
        prefix = "val/" if row.get("kind") == "eval" else "train/"
        data = {("rho" if k == "rho" else prefix + k): v for k, v in row.items() if k not in ("kind", "step")}
        self.run.log({**data, "step": step}, step=step)

    def finish(self, status: str) -> None:
        self.run.summary["status"] = status
        self.run.finish(exit_code=0 if status == "completed" else 1)


def check_credentials(lg: DictConfig) -> None:
    """Online logging needs a W&B key; without one, wandb.init would prompt or hang, so say it first."""
    if lg.name == "wandb" and lg.mode == "online" and not (os.environ.get("WANDB_API_KEY") or _netrc_has_wandb()):
        raise ConfigError(
            "logger.mode=online needs a W&B key (WANDB_API_KEY or `wandb login`); or use logger.mode=offline"
        )


def _netrc_has_wandb() -> bool:
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text()


def make_logger(cfg: DictConfig, run_dir: Path) -> NullLogger | WandbLogger:
    return WandbLogger(cfg, run_dir) if cfg.logger.name == "wandb" else NullLogger()
