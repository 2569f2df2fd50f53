"""One run: train (or resume, or skip) a composed config in its run folder, and say how it ended.

The run folder holds everything the analysis and a resumed process need: config.yaml, metrics.jsonl,
summary.json, checkpoints/. Training failures are recorded (status failed | diverged), not raised;
only a config problem raises (ConfigError), before anything is written.
"""

from __future__ import annotations

import math
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from cart_sweeps.compose import compose_config
from cart_sweeps.config import ConfigError, run_id, run_label, validate
from cart_sweeps.data.loader import load_prepared, train_batch, val_windows
from cart_sweeps.model import build_model, train_flops_per_token
from cart_sweeps.train import checkpoint as ckpt
from cart_sweeps.train.device import amp_dtype, pick_device
from cart_sweeps.train.evaluate import evaluate_run, with_source
from cart_sweeps.train.logger import make_logger
from cart_sweeps.train.loop import eval_metrics, evaluate_windows, train_step
from cart_sweeps.train.metrics import MetricsLog, environment, mfu, peak_mem_mb
from cart_sweeps.train.optim import build_optimizer, build_scheduler
from cart_sweeps.train.runfolder import base_summary, read_summary, write_summary


class Diverged(RuntimeError):
    """The training loss stopped being finite."""


def run_job(overrides: list[str], run_dir: str) -> dict[str, Any]:
    """Compose `overrides` from the real conf/ tree and execute that run in `run_dir` (the sweeps' entry)."""
    return execute(compose_config(overrides), Path(run_dir))


def execute(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Validate, then train / resume / evaluate in `run_dir`; returns the summary it wrote."""
    if cfg.stage.kind == "evaluate":
        cfg = with_source(cfg)
    validate(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    rid = run_id(cfg)
    done = read_summary(run_dir)
    if done is not None and done.get("run_id") != rid:
        raise ConfigError(
            f"{run_dir} holds run {done.get('label')} ({done.get('run_id')}), not this config ({rid}); "
            "choose another folder with hydra.run.dir=DIR"
        )
    if done is not None and done["status"] == "completed":
        print(f"{run_label(cfg)}: already completed at step {done['step']} in {run_dir}; nothing to do")
        return done
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    if cfg.stage.kind == "evaluate":
        return evaluate_run(cfg, run_dir)
    return Trainer(cfg, run_dir).run()


class Trainer:
    """The paper's recipe for one config: step-addressed data, AdamW, warm-up + cosine, clip, evals."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        self.cfg, self.t, self.run_dir = cfg, cfg.trainer, run_dir
        if self.t.threads > 0:
            torch.set_num_threads(self.t.threads)
        if self.t.deterministic:
            torch.use_deterministic_algorithms(True)
        self.device = pick_device(self.t.device)
        self.amp = amp_dtype(self.t.precision, self.device)
        self.data = load_prepared(cfg.data)
        if self.data.vocab_size > cfg.model.vocab_size:
            raise ConfigError(
                f"data={cfg.data.name} has a vocabulary of {self.data.vocab_size}, more than "
                f"model.vocab_size={cfg.model.vocab_size}; raise model.vocab_size"
            )
        torch.manual_seed(cfg.seed)  # seeds change only the init; the data order is fixed
        self.model = build_model(cfg.model).to(self.device)
        self.forward = torch.compile(self.model) if self.t.compile else self.model
        self.optimizer = build_optimizer(self.model, self.t, self.device)
        self.scheduler = build_scheduler(self.optimizer, self.t)
        self.flops_per_token = train_flops_per_token(cfg.model, self.t.seq_len)
        self.tokens_per_step = self.t.micro_batch_size * self.t.grad_accum * self.t.seq_len
        self.summary = base_summary(cfg)

    def _resume(self) -> int:
        found = ckpt.list_checkpoints(self.run_dir)
        if not found:
            return 0
        state = ckpt.load_checkpoint(found[-1], self.device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        print(f"{self.summary['label']}: resuming from step {state['step']} ({found[-1].name})")
        return state["step"]

    def _save(self, step: int) -> None:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": step,
            "rng": ckpt.rng_state(),
        }
        meta = {"run_id": self.summary["run_id"], "label": self.summary["label"], "tokens": step * self.tokens_per_step}
        ckpt.save_checkpoint(self.run_dir, step, state, meta, keep=self.t.keep_checkpoints)

    def _batches(self, step: int):
        for micro in range(self.t.grad_accum):
            x, y = train_batch(self.data.train, step, micro, self.t.micro_batch_size, self.t.grad_accum, self.t.seq_len)
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _rho(self) -> float | None:
        return self.model.rho()

    def evaluate(self) -> dict[str, float]:
        """PPL, bits per byte and CE on the first `eval_windows` windows of each validation set."""
        out: dict[str, float] = {}
        for name, tokens in self.data.val.items():
            windows = val_windows(tokens, self.t.eval_windows, self.t.seq_len).to(self.device)
            metrics = eval_metrics(
                evaluate_windows(self.model, windows, self.t.eval_batch_size), self.data.bytes_per_token[name]
            )
            out.update({f"{key}_{name}": value for key, value in metrics.items()})
        return out

    def run(self) -> dict[str, Any]:
        start_step = self._resume()
        metrics = MetricsLog(self.run_dir / "metrics.jsonl", start_step)
        logger = make_logger(self.cfg, self.run_dir)
        previous = read_summary(self.run_dir) or {}
        wall_before = previous.get("wall_time_s", 0.0) if start_step else 0.0
        self.summary.update(status="running", step=start_step, env=environment(self.device))
        write_summary(self.run_dir, self.summary)
        wall0, status = time.perf_counter(), "failed"
        window_t0, window_tokens, tokens_per_s = time.perf_counter(), 0, 0.0
        try:
            for step in range(start_step + 1, self.t.steps + 1):
                loss, grad_norm = train_step(
                    self.forward, self.optimizer, self._batches(step - 1), self.t.grad_accum, self.amp, self.t.grad_clip
                )
                lr = self.scheduler.get_last_lr()[0]
                self.scheduler.step()
                if not math.isfinite(loss):
                    raise Diverged(f"loss became {loss} at step {step} (lr {lr:.3g}); lower trainer.lr")
                window_tokens += self.tokens_per_step
                if step % self.t.log_every == 0 or step == self.t.steps:
                    elapsed = time.perf_counter() - window_t0
                    tokens_per_s = window_tokens / elapsed
                    row = {
                        "step": step,
                        "kind": "train",
                        "loss": loss,
                        "grad_norm": grad_norm,
                        "lr": lr,
                        "tokens": step * self.tokens_per_step,
                        "rho": self._rho(),
                        "tokens_per_s": tokens_per_s,
                        "mfu": mfu(tokens_per_s, self.flops_per_token, self.device),
                        "peak_mem_mb": peak_mem_mb(self.device),
                    }
                    metrics.write(row)
                    logger.log(row, step)
                    window_t0, window_tokens = time.perf_counter(), 0
                if step % self.t.eval_every == 0 or step == self.t.steps:
                    row = {"step": step, "kind": "eval", **self.evaluate(), "rho": self._rho()}
                    metrics.write(row)
                    logger.log(row, step)
                    self.summary.update({k: v for k, v in row.items() if k != "kind"})
                if step % self.t.ckpt_every == 0 or step == self.t.steps:
                    self._save(step)
                    self.summary.update(step=step, wall_time_s=wall_before + time.perf_counter() - wall0)
                    write_summary(self.run_dir, self.summary)
            status = "completed"
        except Diverged as err:
            status, self.summary["error"] = "diverged", str(err)
            print(f"{self.summary['label']}: diverged: {err}")
        except Exception as err:  # recorded, then re-raised: the summary must say how the run ended
            self.summary["error"] = f"{type(err).__name__}: {err}"
            (self.run_dir / "error.log").write_text(traceback.format_exc())
            raise
        except BaseException:  # Ctrl-C, SIGTERM, a SLURM requeue: resumable, not a failure
            status = "interrupted"
            raise
        finally:
            self.summary.update(
                status=status, tokens_per_s=tokens_per_s, wall_time_s=wall_before + time.perf_counter() - wall0
            )
            write_summary(self.run_dir, self.summary)
            logger.finish(status)
        return self.summary
