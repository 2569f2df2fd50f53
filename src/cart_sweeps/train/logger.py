"""Dashboards by `logger.name`: W&B (offline unless asked for online), TensorBoard (train/tensorboard.py) or
none. A new logger is a class with `log` and `finish` built from (cfg, run_dir), a `LoggerName` member, its path
in LOGGERS, and conf/logger/<name>.yaml.
"""

from __future__ import annotations

import json
import netrc
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import DRIVER, REPORTING, Config, ConfigError, keys_with
from cart_sweeps.entry import load
from cart_sweeps.identity import run_id
from cart_sweeps.metric import per_set_names, require
from cart_sweeps.naming import model_parts, run_label
from cart_sweeps.options import LoggerName
from cart_sweeps.record.runfolder import atomic_write


class Logger(Protocol):
    """`walltime`: when the row was logged (Unix time), given by a backfill; None: now."""

    def log(self, row: dict[str, Any], step: int, walltime: float | None = None) -> None: ...

    def finish(self, status: str) -> None: ...


class NullLogger:
    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        pass

    def log(self, row: dict[str, Any], step: int, walltime: float | None = None) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


NOT_RECORDED = keys_with(Config, DRIVER, REPORTING)  # how runs are driven and where they report, not what a run is


def run_config(cfg: DictConfig) -> dict[str, Any]:
    """The config a W&B run records: the run's own (model, data, trainer, stage, scale, seed), not the driver's."""
    full = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    return {k: v for k, v in full.items() if k not in NOT_RECORDED}


def wandb_id(cfg: DictConfig) -> str:
    """The W&B run id: one per (stage, run id), so a resumed run continues its W&B run."""
    return f"{cfg.stage.name}-{run_id(cfg)}"


def wandb_tags(cfg: DictConfig) -> list[str]:
    """A run's W&B tags: its stage, scale, model kind, its label's model part piece by piece, and its seed."""
    m = cfg.model
    tags = [f"stage-{cfg.stage.name}", f"scale-{cfg.scale.name}", str(m.name), *model_parts(m), f"seed{cfg.seed}"]
    return list(dict.fromkeys(tags))


def wandb_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl row as W&B keys (TensorBoard's tags too): train/<key> or val/<key> by the row's kind, and
    rho; None left out."""
    prefix = "val/" if row.get("kind") == "eval" else "train/"
    return {
        ("rho" if k == "rho" else prefix + k): v for k, v in row.items() if k not in ("kind", "step") and v is not None
    }


LOGGED = Path("wandb") / "logged.json"  # in the run folder, beside W&B's own files of the run
TB_LOGGED = Path("tensorboard.json")  # in the run folder, beside its TensorBoard event files


@dataclass(frozen=True)
class Logged:
    """What of a run folder's metrics.jsonl its W&B run holds (every row up to `step`, its `status`), so neither
    the live logger nor a backfill logs a row twice; `writing`: the W&B folder a cut-off backfill was writing."""

    id: str
    step: int
    status: str
    writing: str | None = None

    @classmethod
    def read(cls, run_dir: Path, where: Path = LOGGED) -> Logged | None:
        try:
            return cls(**json.loads((run_dir / where).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self, run_dir: Path, where: Path = LOGGED) -> None:
        (run_dir / where).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(asdict(self))
        atomic_write(run_dir / where, lambda tmp: tmp.write_text(text))


class WandbLogger:
    """One W&B run per training run (`wandb_id`), continued when the run resumes."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        import wandb

        lg = cfg.logger
        check_credentials(lg)
        self.wandb, self.run_dir, self.id = wandb, run_dir, wandb_id(cfg)
        before = Logged.read(run_dir)
        self.step = before.step if before is not None and before.id == self.id else 0
        self.run = wandb.init(
            project=lg.project,
            entity=lg.entity,
            mode=lg.mode,  # explicit: an unset mode prompts for a login and waits forever
            dir=str(run_dir),
            id=self.id,
            resume="allow",
            group=f"stage-{cfg.stage.name}",
            job_type=cfg.stage.name,
            name=run_label(cfg),
            tags=wandb_tags(cfg),
            config=run_config(cfg),
            settings=wandb.Settings(silent=True, console="off"),
        )
        self.run.define_metric("step")
        for key in ("train/*", "val/*", "rho"):
            self.run.define_metric(key, step_metric="step")
        for name in per_set_names([v.name for v in cfg.data.validation]):  # each one's best, in its direction
            best = "max" if require(name).higher_is_better else "min"
            self.run.define_metric(f"val/{name}", step_metric="step", summary=f"{best},last")

    @property
    def folder(self) -> Path:
        """The W&B run's own folder (wandb/offline-run-<time>-<id>, or wandb/run-<time>-<id> online)."""
        return Path(self.run.dir).parent

    def log(self, row: dict[str, Any], step: int, walltime: float | None = None) -> None:
        when = {} if walltime is None else {"_timestamp": walltime}  # W&B's own key for when a row was logged
        self.run.log({**wandb_metrics(row), "step": step, **when}, step=step)
        self.step = max(self.step, step)

    def finish(self, status: str) -> None:
        self.run.summary["status"] = status
        self.run.finish(exit_code=0 if status == "completed" else 1)
        Logged(self.id, self.step, status).write(self.run_dir)


def check_credentials(lg: DictConfig, used: bool = False) -> None:
    """Online logging needs W&B credentials (wandb.init would prompt or hang); `used`: whatever logger.name is."""
    if (used or lg.name == "wandb") and lg.mode == "online" and not has_wandb_login():
        raise ConfigError(
            "logger.mode=online needs a W&B login (`wandb login`, or WANDB_API_KEY); or use logger.mode=offline"
        )


def has_wandb_login() -> bool:
    """Whether W&B finds credentials: WANDB_API_KEY, an identity token file, or `wandb login`'s netrc entry."""
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
    LoggerName.tensorboard: "cart_sweeps.train.tensorboard.TensorBoardLogger",
}


def make_logger(cfg: DictConfig, run_dir: Path) -> Logger:
    return cast(Logger, load(LOGGERS[LoggerName(cfg.logger.name)], "logger.name")(cfg, run_dir))
