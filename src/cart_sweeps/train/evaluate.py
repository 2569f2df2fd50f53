"""Variable-R inference: evaluate a trained run's newest checkpoint at another loop count, no training."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from cart_sweeps.config import ConfigError
from cart_sweeps.data.loader import load_prepared
from cart_sweeps.model import build_model
from cart_sweeps.model.cart import CART
from cart_sweeps.model.dense import Dense
from cart_sweeps.status import RunStatus
from cart_sweeps.summary import RunSummary
from cart_sweeps.train import checkpoint as ckpt
from cart_sweeps.train.device import pick_device
from cart_sweeps.train.loop import evaluate_sets
from cart_sweeps.train.runfolder import base_summary, write_summary


def load_trained(run_dir: Path, model_cfg: DictConfig, device: torch.device, key: str) -> tuple[CART | Dense, int]:
    """The model of `run_dir`'s newest checkpoint on `device`, and its step; `key` names the setting in errors.

    Shared by variable-R inference and the benchmark harness, so both read a trained run the same way.
    """
    found = ckpt.list_checkpoints(run_dir)
    if not found:
        raise ConfigError(f"{key}={run_dir} has no checkpoint yet; train it first")
    model = build_model(model_cfg).to(device)
    try:
        state = ckpt.restore(found[-1], device, lambda state: model.load_state_dict(state["model"]))
    except ckpt.CheckpointError as err:  # the source run's files are its own: say so, change nothing there
        raise ConfigError(
            f"{key}: {err}; relaunch the source run so it rewrites it "
            "(remove its summary.json first if that says completed)"
        ) from err
    model.eval()
    return model, state["step"]


def evaluate_run(cfg: DictConfig, run_dir: Path) -> RunSummary:
    """Evaluate `stage.source`'s newest checkpoint at R = stage.eval_n_loops (perplexity, and the lm-eval tasks
    of `harness.tasks`); write and return the summary."""
    device = pick_device(cfg.trainer.device)
    model, step = load_trained(Path(cfg.stage.source), cfg.model, device, "stage.source")
    r = cfg.stage.eval_n_loops
    summary = base_summary(cfg)
    summary.update(
        {
            "status": RunStatus.COMPLETED,
            "step": step,
            "eval_n_loops": r,
            "trained_n_loops": cfg.model.n_loops,
            "source": str(cfg.stage.source),
            "rho": model.rho(),
            **evaluate_sets(model, load_prepared(cfg.data), cfg.trainer, device, n_loops=r),
        }
    )
    if cfg.harness.tasks:
        from cart_sweeps.harness.bench import run_benchmarks  # lm-eval takes seconds to import: only when asked

        h, shots = cfg.harness, cfg.stage.num_fewshot
        summary.details["num_fewshot"] = shots
        summary.update(run_benchmarks(Path(cfg.stage.source), r, list(h.tasks), run_dir, shots, h.limit, h.batch_size))
    write_summary(run_dir, summary)
    return summary
