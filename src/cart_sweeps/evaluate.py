"""Variable-R inference (an evaluate stage's run): a trained run's final checkpoint at another loop count."""

from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import ConfigError
from cart_sweeps.data.hashes import file_sha256
from cart_sweeps.data.loader import load_prepared
from cart_sweeps.record.runfolder import base_summary, checkpoint_path, write_summary
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.status import RunStatus
from cart_sweeps.train.checkpoint import load_trained
from cart_sweeps.train.loop import Diverged, evaluate_sets, raise_if_diverged
from cart_sweeps.train.setup import pick_device


def evaluate_run(cfg: DictConfig, run_dir: Path) -> RunSummary:
    """Evaluate the checkpoint `evaluated` names at R = stage.eval_n_loops (perplexity, and `harness.tasks`)."""
    started = time.perf_counter()
    device = pick_device(cfg.trainer.device)
    source, step = Path(cfg.stage.source), cfg.evaluated.step
    path = checkpoint_path(source, step)
    if file_sha256(path) != cfg.evaluated.sha256:  # the bytes themselves: a damaged copy, a file replaced
        raise ConfigError(
            f"stage.source: {path} is not the checkpoint its run saved (its sha256 differs); relaunch the source "
            "run so it rewrites it (remove its summary.json first)"
        )
    model, _ = load_trained(source, cfg.model, device, "stage.source", step)
    r, summary, data = cfg.stage.eval_n_loops, base_summary(cfg), load_prepared(cfg.data)
    metrics = evaluate_sets(model, data, cfg.trainer, device, n_loops=r)
    summary.update(
        {
            "status": RunStatus.COMPLETED,
            "step": step,
            "eval_n_loops": r,
            "trained_n_loops": cfg.model.n_loops,
            "source": str(source),
            "evaluated": OmegaConf.to_container(cfg.evaluated),
            "data_sha256": data.digests,
            "rho": model.rho(),
            **metrics,
        }
    )
    try:
        raise_if_diverged(metrics, f"at R={r}")
    except Diverged as err:
        summary.status, summary.error = RunStatus.DIVERGED, str(err)
    if cfg.harness.tasks and summary.status == RunStatus.COMPLETED:
        from cart_sweeps.harness.bench import run_benchmarks  # lm-eval takes seconds to import: only when asked

        h, shots = cfg.harness, cfg.stage.num_fewshot
        summary.details["num_fewshot"] = shots
        summary.update(run_benchmarks(source, r, list(h.tasks), run_dir, shots, h.limit, h.batch_size, step))
    summary.wall_time_s = time.perf_counter() - started  # its own time, as a training run records it
    write_summary(run_dir, summary)
    return summary
