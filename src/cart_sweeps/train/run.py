"""One run: train (or resume, or skip) a composed config in its run folder, and say how it ended.

The run folder holds everything the analysis and a resumed process need: config.yaml, metrics.jsonl,
summary.json, checkpoints/; one process owns it at a time. A divergence is recorded (status diverged);
an error while resuming or training is recorded (status failed, error.log), then raised; only a config
problem raises (ConfigError) before anything is written.
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
from cart_sweeps.status import RunStatus
from cart_sweeps.train import checkpoint as ckpt
from cart_sweeps.train.device import amp_dtype, pick_device
from cart_sweeps.train.evaluate import evaluate_run, with_source
from cart_sweeps.train.logger import NullLogger, WandbLogger, make_logger
from cart_sweeps.train.loop import eval_metrics, evaluate_windows, train_step
from cart_sweeps.train.metrics import MetricsLog, environment, mfu, peak_mem_mb
from cart_sweeps.train.optim import build_optimizer, build_scheduler
from cart_sweeps.train.progress import RunProgress
from cart_sweeps.train.runfolder import METRICS, atomic_write, base_summary, owned, read_summary, write_summary


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
    with owned(run_dir):
        held = _held_run(run_dir)
        if held is not None and held.get("run_id") != rid:
            raise ConfigError(
                f"{run_dir} holds run {held.get('label')} ({held.get('run_id')}), not this config ({rid}); "
                "choose another folder with hydra.run.dir=DIR"
            )
        if held is not None and held.get("status") == RunStatus.COMPLETED:
            print(f"{run_label(cfg)}: already completed at step {held['step']} in {run_dir}; nothing to do")
            return held
        atomic_write(run_dir / "config.yaml", lambda tmp: OmegaConf.save(cfg, tmp, resolve=True))
        if cfg.stage.kind == "evaluate":
            return evaluate_run(cfg, run_dir)
        return Trainer(cfg, run_dir).run()


def _held_run(run_dir: Path) -> dict[str, Any] | None:
    """What the folder says of its run (run_id, label): its summary, else its config.yaml, else a checkpoint."""
    if (summary := read_summary(run_dir)) is not None:
        return summary
    try:
        saved = OmegaConf.load(run_dir / "config.yaml")
        return {"run_id": run_id(saved), "label": run_label(saved)}
    except Exception:  # missing or damaged: the checkpoints' meta names the run too
        pass
    for path in reversed(ckpt.list_checkpoints(run_dir)):
        try:
            return ckpt.read_meta(path)
        except (OSError, ValueError):
            continue
    return None


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
        self._init_state()
        self.flops_per_token = train_flops_per_token(cfg.model, self.t.seq_len)
        self.tokens_per_step = self.t.micro_batch_size * self.t.grad_accum * self.t.seq_len
        self.summary = base_summary(cfg)
        self.progress = RunProgress(self.summary["label"], self.t.steps)

    def _init_state(self) -> None:
        """The step-0 model, optimizer and schedule (built again after a checkpoint half-loaded into them)."""
        torch.manual_seed(self.cfg.seed)  # seeds change only the init; the data order is fixed
        self.model = build_model(self.cfg.model).to(self.device)
        self.forward = torch.compile(self.model) if self.t.compile else self.model
        self.optimizer = build_optimizer(self.model, self.t, self.device)
        self.scheduler = build_scheduler(self.optimizer, self.t)

    def _load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])

    def _resume(self) -> int:
        """The step of the newest checkpoint that loads; each newer one that does not is set aside."""
        label, found = self.summary["label"], ckpt.list_checkpoints(self.run_dir)
        for path in reversed(found):
            try:
                state = ckpt.restore(path, self.device, self._load)
            except ckpt.CheckpointError as err:
                print(f"{label}: {err}; set aside as {ckpt.set_aside(path).name}, trying the one before")
                self._init_state()
                continue
            print(f"{label}: resuming from step {state['step']} ({path.name})")
            return state["step"]
        if found:
            print(f"{label}: no checkpoint loads; starting from step 0")
        return 0

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

    def _due(self, step: int, every: int) -> bool:
        return step > 0 and (step % every == 0 or step == self.t.steps)

    def _note(self, row: dict[str, Any]) -> None:
        """Carry a logged row into the summary: an eval row's metrics, a train row's throughput."""
        if row["kind"] == "eval":
            self.summary.update({k: v for k, v in row.items() if k != "kind"})
        else:
            self.summary["tokens_per_s"] = row["tokens_per_s"]

    def _log(self, row: dict[str, Any], metrics: MetricsLog, logger: NullLogger | WandbLogger) -> None:
        metrics.write(row)
        logger.log(row, row["step"])
        if row["kind"] == "train":
            self.progress.update(row)
        self._note(row)

    def _eval(self, step: int, metrics: MetricsLog, logger: NullLogger | WandbLogger) -> None:
        self._log({"step": step, "kind": "eval", **self.evaluate(), "rho": self._rho()}, metrics, logger)

    def run(self) -> dict[str, Any]:
        """Resume (the summary rebuilt from the kept records), train to the end; record how it ended."""
        previous = read_summary(self.run_dir) or {}
        logger = make_logger(self.cfg, self.run_dir)
        self.summary.update(status=RunStatus.RUNNING, env=environment(self.device))
        wall0, wall_before, status = time.perf_counter(), 0.0, RunStatus.FAILED
        try:
            start_step = self._resume()
            wall_before = previous.get("wall_time_s", 0.0) if start_step else 0.0
            metrics = MetricsLog(self.run_dir / METRICS, start_step)
            for row in metrics.rows:
                self._note(row)
            self.summary["step"] = start_step
            write_summary(self.run_dir, self.summary)
            logged = {(row["kind"], row["step"]) for row in metrics.rows}
            if self._due(start_step, self.t.eval_every) and ("eval", start_step) not in logged:
                self._eval(start_step, metrics, logger)  # its row was lost; the checkpoint holds those weights
            window_t0, window_tokens = time.perf_counter(), 0
            for step in range(start_step + 1, self.t.steps + 1):
                loss, grad_norm = train_step(
                    self.forward, self.optimizer, self._batches(step - 1), self.t.grad_accum, self.amp, self.t.grad_clip
                )
                lr = self.scheduler.get_last_lr()[0]
                self.scheduler.step()
                if not math.isfinite(loss):
                    raise Diverged(f"loss became {loss} at step {step} (lr {lr:.3g}); lower trainer.lr")
                window_tokens += self.tokens_per_step
                if self._due(step, self.t.log_every):
                    tokens_per_s = window_tokens / (time.perf_counter() - window_t0)
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
                    self._log(row, metrics, logger)
                    window_t0, window_tokens = time.perf_counter(), 0
                if self._due(step, self.t.eval_every):
                    self._eval(step, metrics, logger)
                if self._due(step, self.t.ckpt_every):
                    self._save(step)
                    self.summary.update(step=step, wall_time_s=wall_before + time.perf_counter() - wall0)
                    write_summary(self.run_dir, self.summary)
            status = RunStatus.COMPLETED
        except Diverged as err:
            status, self.summary["error"] = RunStatus.DIVERGED, str(err)
            print(f"{self.summary['label']}: diverged: {err}")
        except Exception as err:  # recorded, then re-raised: the summary must say how the run ended
            self.summary["error"] = f"{type(err).__name__}: {err}"
            (self.run_dir / "error.log").write_text(traceback.format_exc())
            raise
        except BaseException:  # Ctrl-C, SIGTERM, a SLURM requeue: resumable, not a failure
            status = RunStatus.INTERRUPTED
            raise
        finally:
            self.summary.update(status=status, wall_time_s=wall_before + time.perf_counter() - wall0)
            write_summary(self.run_dir, self.summary)
            logger.finish(status)
            self.progress.close()
        return self.summary
