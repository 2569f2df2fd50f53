"""One run: train (or resume, or skip) a composed config in its run folder, or evaluate one (an evaluate
stage's run: variable-R inference), and record how it ended: a divergence as status diverged, an error as
status failed with error.log (then raised); only a config problem (ConfigError) raises before anything is written.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import DictConfig, OmegaConf

from cart_sweeps import interrupt
from cart_sweeps.config import ConfigError
from cart_sweeps.data.hashes import file_sha256
from cart_sweeps.data.loader import load_prepared, train_batch
from cart_sweeps.identity import run_id
from cart_sweeps.model import train_flops_per_token
from cart_sweeps.naming import run_label
from cart_sweeps.options import StageKind
from cart_sweeps.record.branch import Parent, branch_parent
from cart_sweeps.record.runfolder import (
    CONFIG,
    METRICS,
    atomic_write,
    base_summary,
    checkpoint_path,
    owned,
    read_meta,
    read_summary,
    with_source,
    write_summary,
)
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.schedule import Schedule
from cart_sweeps.status import RunStatus
from cart_sweeps.train import checkpoint as ckpt
from cart_sweeps.train.checkpoint import load_trained
from cart_sweeps.train.logger import Logger, make_logger
from cart_sweeps.train.loop import Diverged, evaluate_sets, raise_if_diverged, train_step
from cart_sweeps.train.metrics import MetricsLog, environment, mfu, peak_mem_mb
from cart_sweeps.train.progress import RunProgress
from cart_sweeps.train.setup import build_state, configure_torch, pick_device
from cart_sweeps.validate import validate


def execute(cfg: DictConfig, run_dir: Path, expected_id: str | None = None) -> RunSummary:
    """Validate, then train / resume / evaluate in `run_dir`; returns the summary it wrote. `expected_id`: the
    id the run's driver knows it by; a config that is another run is refused, never run under that name."""
    if StageKind.of(cfg).reads_checkpoint:
        cfg = with_source(cfg)
    validate(cfg)
    parent = branch_parent(cfg)  # a branch's parent, checked before anything is written
    run_dir.mkdir(parents=True, exist_ok=True)
    rid = run_id(cfg)
    if expected_id is not None and rid != expected_id:
        raise ConfigError(
            f"{run_dir}: this run's config is run {rid}, not the {expected_id} its stage planned (an evaluated "
            "run trained further since the launch began? else a bug: please report it); relaunch the stage"
        )
    with owned(run_dir):
        held = _held_run(run_dir)
        if held is not None and held.run_id != rid:
            raise ConfigError(
                f"{run_dir} holds run {held.label} ({held.run_id}), not this config ({rid}); "
                "choose another folder with hydra.run.dir=DIR"
            )
        if held is not None and held.status == RunStatus.COMPLETED:
            print(f"{run_label(cfg)}: already completed at step {held.step} in {run_dir}; nothing to do")
            return held
        atomic_write(run_dir / CONFIG, lambda tmp: OmegaConf.save(cfg, tmp, resolve=True))
        if StageKind.of(cfg).reads_checkpoint:
            return evaluate_run(cfg, run_dir)
        return Trainer(cfg, run_dir, parent).run()


def kept_steps(t: DictConfig) -> frozenset[int]:
    """The steps whose full checkpoint a run keeps for branches: trainer.keep_checkpoints_at, and under wsd with
    trainer.keep_final_optimizer (a run meant to train further) its decay start, where a longer run branches."""
    at, schedule = set(t.keep_checkpoints_at), Schedule.of(t)
    if schedule.branchable and t.keep_final_optimizer and schedule.decay_start > 0:
        at.add(schedule.decay_start)
    return frozenset(at)


def _held_run(run_dir: Path) -> RunSummary | None:
    """What the folder says of its run (run_id, label): its summary, else its config.yaml, else a checkpoint."""
    if (summary := read_summary(run_dir)) is not None:
        return summary
    try:
        saved = cast(DictConfig, OmegaConf.load(run_dir / CONFIG))
        return RunSummary(RunStatus.RUNNING, run_id=run_id(saved), label=run_label(saved))
    except Exception:  # missing or damaged: the checkpoints' meta names the run too
        pass
    for path in reversed(ckpt.list_checkpoints(run_dir)):
        try:
            meta = read_meta(path)
            return RunSummary(RunStatus.RUNNING, run_id=meta.get("run_id"), label=meta.get("label"))
        except (OSError, ValueError):
            continue
    return None


class Trainer:
    """The paper's recipe for one config. A step leaves its loss on the device: finiteness is tracked there and
    read back at the next log, evaluation or checkpoint step, so a divergence is caught before it is saved."""

    def __init__(self, cfg: DictConfig, run_dir: Path, parent: Parent | None = None) -> None:
        self.cfg, self.t, self.run_dir, self.parent = cfg, cfg.trainer, run_dir, parent
        self.device, self.amp = configure_torch(cfg)
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
        self.summary.details["data_sha256"] = self.data.digests  # what it trained and evaluated on
        if parent is not None:  # its steps up to branch_step are its parent's (docs/wsd.md)
            self.summary.details |= {"parent_run_id": parent.run_id, "branch_step": parent.step}
        self.kept = kept_steps(self.t)
        self._first_bad = torch.zeros((), dtype=torch.long, device=self.device)  # step of the first non-finite loss
        self._bad_loss = torch.zeros((), device=self.device)
        self._last: tuple[torch.Tensor, torch.Tensor, float] | None = None  # the last step's loss, grad norm, lr
        self._window = (time.perf_counter(), 0)  # start and tokens of the current throughput window
        assert self.summary.label is not None  # base_summary names the run
        self.progress = RunProgress(self.summary.label, self.t.steps)

    def _init_state(self) -> None:
        """The step-0 model, optimizer and schedule (built again after a checkpoint half-loaded into them)."""
        self.model, self.forward, self.optimizer, self.scheduler = build_state(self.cfg, self.device)

    def _load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        elif state["step"] != self.t.steps:  # only a finished run's final weights go without it
            raise ValueError(f"step {state['step']} of {self.t.steps} holds no optimizer state")
        ckpt.set_rng_state(state["rng"])

    def _resume(self) -> int:
        """The step of the newest checkpoint that loads; each newer one that does not is set aside."""
        label, found = self.summary.label, ckpt.list_checkpoints(self.run_dir)
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

    def _branch(self, parent: Parent) -> int:
        """Start from the parent's checkpoint at the branch step: its weights, optimizer state and RNG, with the
        schedule placed at that step by this run's own schedule (its decay may start right there)."""
        try:
            ckpt.restore(parent.checkpoint, self.device, self._load_branch)
        except ckpt.CheckpointError as err:
            raise ConfigError(
                f"trainer.branch_from={parent.run_dir}: {err} as a branch's start (it needs the optimizer's state: "
                f"train the parent with trainer.keep_checkpoints_at=[{parent.step}])"
            ) from err
        print(f"{self.summary.label}: branching from {parent.run_dir.name} at step {parent.step}")
        return parent.step

    def _load_branch(self, state: dict[str, Any]) -> None:
        self._load(state)  # the parent's base lrs and step count too
        self.scheduler.last_epoch = state["step"] - 1
        self.scheduler.step()  # to the branch step, by this run's schedule: each group's lr and get_last_lr()

    def _batches(self, step: int):
        for micro in range(self.t.grad_accum):
            x, y = train_batch(self.data.train, step, micro, self.t.micro_batch_size, self.t.grad_accum, self.t.seq_len)
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def step(self, step: int) -> None:
        """Optimizer step `step` (1-based) on its batch; nothing is read back from the device."""
        loss, grad_norm = train_step(
            self.forward, self.optimizer, self._batches(step - 1), self.t.grad_accum, self.amp, self.t.grad_clip
        )
        lr = cast(float, self.scheduler.get_last_lr()[0])  # float lrs (torch types them float | Tensor)
        self.scheduler.step()
        bad = ~torch.isfinite(loss) & (self._first_bad == 0)
        self._first_bad = torch.where(bad, step, self._first_bad)
        self._bad_loss = torch.where(bad, loss, self._bad_loss)
        self._last = (loss, grad_norm, lr)
        self._window = (self._window[0], self._window[1] + self.tokens_per_step)

    def _raise_if_diverged(self) -> None:
        """Read the device's record of non-finite losses (a host sync): raise Diverged at the first one."""
        first = int(self._first_bad.item())
        if first:
            lr = Schedule.of(self.t).lr_at(first - 1)
            raise Diverged(f"loss became {self._bad_loss.item()} at step {first} (lr {lr:.3g}); lower trainer.lr")

    def log(self, step: int) -> None:
        """The train row of `step`: its loss, grad norm and lr, and the throughput since the last log."""
        assert self._last is not None
        loss, grad_norm, lr = self._last[0].item(), self._last[1].item(), self._last[2]  # waits for the device
        start, tokens = self._window
        tokens_per_s = tokens / (time.perf_counter() - start)
        self._record(
            {
                "step": step,
                "kind": "train",
                "loss": loss,
                "grad_norm": grad_norm,
                "lr": lr,
                "tokens": step * self.tokens_per_step,
                "rho": self.model.rho(),
                "tokens_per_s": tokens_per_s,
                "mfu": mfu(tokens_per_s, self.flops_per_token, self.device),
                "peak_mem_mb": peak_mem_mb(self.device),
            }
        )
        self._window = (time.perf_counter(), 0)

    def evaluate(self, step: int) -> None:
        """The eval row of `step`: PPL, bits per byte and CE on each validation set, and rho."""
        metrics = evaluate_sets(self.model, self.data, self.t, self.device)
        self._record({"step": step, "kind": "eval", **metrics, "rho": self.model.rho()})
        raise_if_diverged(metrics, f"at step {step}")

    def checkpoint(self, step: int) -> None:
        """Save the state at `step` and say so in the summary. The final one is the weights alone unless
        trainer.keep_final_optimizer: nothing resumes a finished run, and AdamW's state is twice its weights."""
        state: dict[str, Any] = {"model": self.model.state_dict(), "step": step, "rng": ckpt.rng_state()}
        kept = step in self.kept
        if step < self.t.steps or self.t.keep_final_optimizer or kept:
            state |= {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        meta = {"run_id": self.summary.run_id, "label": self.summary.label, "tokens": step * self.tokens_per_step}
        ckpt.save_checkpoint(self.run_dir, step, state, meta, keep=self.t.keep_checkpoints, kept=kept)
        self.summary.step, self.summary.wall_time_s = step, self._wall()
        write_summary(self.run_dir, self.summary)

    def _due(self, step: int, every: int) -> bool:
        return step > 0 and (step % every == 0 or step == self.t.steps)

    def _note(self, row: dict[str, Any]) -> None:
        """Carry a logged row into the summary: an eval row's metrics, a train row's throughput."""
        if row["kind"] == "eval":
            self.summary.update({k: v for k, v in row.items() if k != "kind"})
        else:
            self.summary.tokens_per_s = row["tokens_per_s"]

    def _record(self, row: dict[str, Any]) -> None:
        self.metrics.write(row)
        self.logger.log(row, row["step"])
        if row["kind"] == "train":
            self.progress.update(row)
        self._note(row)

    def _wall(self) -> float:
        return self._wall_before + time.perf_counter() - self._wall0

    def _start(self) -> int:
        """Resume (the summary rebuilt from the kept records); the step to continue after."""
        previous = read_summary(self.run_dir)
        start_step = self._resume()
        if start_step == 0 and self.parent is not None:
            start_step = self._branch(self.parent)
        self._wall_before = (previous.wall_time_s or 0.0) if previous and start_step else 0.0
        self.metrics = MetricsLog(self.run_dir / METRICS, start_step)
        for row in self.metrics.rows:
            self._note(row)
        self.summary.step = start_step
        write_summary(self.run_dir, self.summary)
        logged = {(row["kind"], row["step"]) for row in self.metrics.rows}
        if self._due(start_step, self.t.eval_every) and ("eval", start_step) not in logged:
            self.evaluate(start_step)  # its row was lost; the checkpoint holds those weights
        return start_step

    def run(self) -> RunSummary:
        """Train from where the run folder left off to the end; record how it ended."""
        self.logger: Logger = make_logger(self.cfg, self.run_dir)
        self.summary.update({"status": RunStatus.RUNNING, "env": environment(self.device)})
        self._wall0, self._wall_before, status = time.perf_counter(), 0.0, RunStatus.FAILED
        try:
            start_step = self._start()
            self._window = (time.perf_counter(), 0)
            self.summary.first_step_at = time.time()
            for step in range(start_step + 1, self.t.steps + 1):
                interrupt.raise_if_received()  # a Ctrl-C swallowed while compiling or setting up
                self.step(step)
                due = [self._due(step, every) for every in (self.t.log_every, self.t.eval_every, self.t.ckpt_every)]
                due[2] = due[2] or step in self.kept
                if any(due):
                    self._raise_if_diverged()
                if due[0]:
                    self.log(step)
                if due[1]:
                    self.evaluate(step)
                if due[2]:
                    self.checkpoint(step)
            status = RunStatus.COMPLETED
        except Diverged as err:
            status, self.summary.error = RunStatus.DIVERGED, str(err)
            print(f"{self.summary.label}: diverged: {err}")
        except Exception as err:  # recorded, then re-raised: the summary must say how the run ended
            self.summary.error = f"{type(err).__name__}: {err}"
            (self.run_dir / "error.log").write_text(traceback.format_exc())
            raise
        except BaseException:  # Ctrl-C, SIGTERM, a SLURM requeue: resumable, not a failure
            status = RunStatus.INTERRUPTED
            raise
        finally:
            self.summary.status, self.summary.wall_time_s = status, self._wall()
            write_summary(self.run_dir, self.summary)
            if status == RunStatus.COMPLETED and not self.t.keep_final_optimizer:
                ckpt.prune(self.run_dir, keep=1)  # recorded completed: only its final weights are needed now
            self.logger.finish(status)
            self.progress.close()
        return self.summary


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
