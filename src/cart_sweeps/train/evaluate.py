"""Variable-R inference: evaluate a trained run's newest checkpoint at another loop count, no training."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from cart_sweeps.config import ConfigError
from cart_sweeps.data.loader import load_prepared
from cart_sweeps.model import build_model
from cart_sweeps.status import RunStatus
from cart_sweeps.summary import RunSummary
from cart_sweeps.train import checkpoint as ckpt
from cart_sweeps.train.device import pick_device
from cart_sweeps.train.loop import evaluate_sets
from cart_sweeps.train.runfolder import base_summary, write_summary


def evaluate_run(cfg: DictConfig, run_dir: Path) -> RunSummary:
    """Evaluate `stage.source`'s newest checkpoint at R = stage.eval_n_loops; write and return the summary."""
    found = ckpt.list_checkpoints(Path(cfg.stage.source))
    if not found:
        raise ConfigError(f"stage.source={cfg.stage.source} has no checkpoint yet; train it first")
    device = pick_device(cfg.trainer.device)
    model = build_model(cfg.model).to(device)
    try:
        state = ckpt.restore(found[-1], device, lambda state: model.load_state_dict(state["model"]))
    except ckpt.CheckpointError as err:  # the source run's files are its own: say so, change nothing there
        raise ConfigError(
            f"stage.source: {err}; relaunch the source run so it rewrites it "
            "(remove its summary.json first if that says completed)"
        ) from err
    r = cfg.stage.eval_n_loops
    summary = base_summary(cfg)
    summary.update(
        {
            "status": RunStatus.COMPLETED,
            "step": state["step"],
            "eval_n_loops": r,
            "trained_n_loops": cfg.model.n_loops,
            "source": str(cfg.stage.source),
            "rho": model.rho(),
            **evaluate_sets(model, load_prepared(cfg.data), cfg.trainer, device, n_loops=r),
        }
    )
    write_summary(run_dir, summary)
    return summary
