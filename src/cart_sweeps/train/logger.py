"""Dashboards: W&B (offline unless asked for online) or a null logger with the same methods, by `logger.name`.

A new logger (MLflow, TensorBoard, ...) is a class with `log` and `finish` built from (cfg, run_dir), a
`LoggerName` member, its path in LOGGERS, and conf/logger/<name>.yaml.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import DRIVER_GROUPS, ConfigError
from cart_sweeps.entry import load
from cart_sweeps.identity import run_id
from cart_sweeps.metric import per_set_names, require
from cart_sweeps.naming import run_label, variant
from cart_sweeps.options import LoggerName


class Logger(Protocol):
    """What the trainer calls: a row of metrics at a step, and how the run ended."""

    def log(self, row: dict[str, Any], step: int) -> None: ...

    def finish(self, status: str) -> None: ...


class NullLogger:
    """Stands in for W&B when `logger=none`: the trainer calls the same methods either way."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        pass

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


NOT_RECORDED = (*DRIVER_GROUPS, "paths", "logger")  # how runs are driven and where they report, not what a run is


def run_config(cfg: DictConfig) -> dict[str, Any]:
    """The config a W&B run records: the run's own (model, data, trainer, stage, scale, seed), not the driver's."""
    full = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    assert isinstance(full, dict)
    return {k: v for k, v in full.items() if k not in NOT_RECORDED}


def wandb_id(cfg: DictConfig) -> str:
    """The W&B run id: one per (stage, run id), the same at every relaunch, so a resumed run continues its
    W&B run and one configuration trained in two stages keeps two (the run id hashes the configuration only)."""
    return f"{cfg.stage.name}-{run_id(cfg)}"


class WandbLogger:
    """One W&B run per training run (`wandb_id`), continued when the run resumes.

    W&B conventions: job_type is the stage, tags carry stage and scale, and each validation set's PPL and
    bits per byte keep their best (min) value in the summary besides their last.
    """

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
            id=wandb_id(cfg),
            resume="allow",
            group=f"stage-{cfg.stage.name}",
            job_type=cfg.stage.name,
            name=run_label(cfg),
            tags=[
                f"stage-{cfg.stage.name}",
                f"scale-{cfg.scale.name}",
                *(f"d{m.d_model}", f"P{m.n_prelude}", f"R{m.n_loops}", m.name, variant(m), f"seed{cfg.seed}"),
            ],
            config=run_config(cfg),
            settings=wandb.Settings(silent=True, console="off"),
        )
        self.run.define_metric("step")
        for key in ("train/*", "val/*", "rho"):
            self.run.define_metric(key, step_metric="step")
        for name in per_set_names([v.name for v in cfg.data.validation]):  # each one's best, in its direction
            best = "max" if require(name).higher_is_better else "min"
            self.run.define_metric(f"val/{name}", step_metric="step", summary=f"{best},last")

    def log(self, row: dict[str, Any], step: int) -> None:
        prefix = "val/" if row.get("kind") == "eval" else "train/"
        data = {  # a figure this device cannot measure (MFU, peak memory on the CPU) is left out, not null
            ("rho" if k == "rho" else prefix + k): v
            for k, v in row.items()
            if k not in ("kind", "step") and v is not None
        }
        self.run.log({**data, "step": step}, step=step)

    def finish(self, status: str) -> None:
        self.run.summary["status"] = status
        self.run.finish(exit_code=0 if status == "completed" else 1)


def check_credentials(lg: DictConfig, used: bool = False) -> None:
    """Online logging needs W&B credentials; without them wandb.init would prompt or hang, so say it first.
    `used`: check whatever logger.name is (the dashboard talks to W&B itself)."""
    if (used or lg.name == "wandb") and lg.mode == "online" and not has_wandb_login():
        raise ConfigError(
            "logger.mode=online needs a W&B login (`wandb login`, or WANDB_API_KEY); or use logger.mode=offline"
        )


def has_wandb_login() -> bool:
    """Whether W&B finds credentials as it looks for them: WANDB_API_KEY, an identity token file, or the
    netrc entry `wandb login` writes for the W&B host (WANDB_BASE_URL; the netrc file is $NETRC or ~/.netrc)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc")).expanduser()
    try:
        entry = netrc.netrc(str(path)).authenticators(host or "")
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


# The class each logger.name builds from (cfg, run_dir), by path (cart_sweeps.entry: one registry style).
LOGGERS = {
    LoggerName.none: "cart_sweeps.train.logger.NullLogger",
    LoggerName.wandb: "cart_sweeps.train.logger.WandbLogger",
}


def make_logger(cfg: DictConfig, run_dir: Path) -> Logger:
    return cast(Logger, load(LOGGERS[LoggerName(cfg.logger.name)], "logger.name")(cfg, run_dir))
