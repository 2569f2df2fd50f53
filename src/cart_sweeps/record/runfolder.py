"""The run folder: its owner (one process at a time), its summary.json, and how its files are written."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from filelock import FileLock, Timeout
from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import ConfigError, EvaluatedConfig
from cart_sweeps.data.hashes import stored_sha256
from cart_sweeps.identity import config_id, run_id
from cart_sweeps.model import param_counts
from cart_sweeps.naming import run_label, variant
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.status import RunStatus

CONFIG = "config.yaml"  # the run's composed config, resolved (written by run.py, read by a resume and evaluations)
SUMMARY = "summary.json"
CKPT_DIR = "checkpoints"
METRICS = "metrics.jsonl"  # one JSON object per logged event (train.metrics.MetricsLog writes it)
LOCK = ".run.lock"
# The environment variable by which a launcher tells its runs how many of them share one machine's cores (or one
# GPU) at once; a run records it (env.runs_at_once), so a throughput measured beside others is read as such.
RUNS_AT_ONCE = "CART_SWEEPS_RUNS_AT_ONCE"


class RunFolderBusy(ConfigError):
    """Another process owns the run folder: two writers would mix up its records."""


def _record_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())


@contextmanager
def owned(run_dir: Path) -> Iterator[None]:
    """Own `run_dir` for the block, or raise RunFolderBusy at once: flock, which the OS releases when its process
    dies (kill -9 included), so a cut-off run never blocks its relaunch (local disks and NFSv4, not NFSv3)."""
    path = run_dir / LOCK
    lock = FileLock(path, on_acquired=_record_pid)  # on_acquired also rules out filelock's soft (pid file) fallback
    try:
        held = lock.acquire(timeout=0)
    except Timeout as err:
        try:
            owner = f" (pid {int(path.read_text())})"
        except (OSError, ValueError):  # gone or not yet written: the owner is ending or starting
            owner = ""
        raise RunFolderBusy(
            f"{run_dir} is in use by another process{owner}; wait for it to end, "
            "or choose another folder with hydra.run.dir=DIR"
        ) from err
    with held:
        yield


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write` a temp file beside `path`, then rename it into place: a reader or a kill never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / CKPT_DIR / f"step_{step:07d}.pt"


def read_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON meta (its run, step and sha256), readable without torch."""
    return json.loads(path.with_suffix(".json").read_text())


def checkpoint_digest(path: Path) -> str:
    """The checkpoint's sha256: its meta's (written at save time), else hashed once per file version."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(read_meta(path)["sha256"])
    return stored_sha256(path)


def source_checkpoint(source: Path) -> dict[str, Any]:
    """What an evaluation of `source` reads: its run id, final step and that checkpoint's digest."""
    summary = read_summary(source)
    if summary is None or summary.status != RunStatus.COMPLETED or summary.step is None:
        how = f"{summary.status} at step {summary.step}" if summary else "without a summary.json"
        raise ConfigError(f"stage.source={source} is {how}, not completed; evaluate it once its training has completed")
    path = checkpoint_path(source, summary.step)
    if not path.is_file():
        raise ConfigError(
            f"stage.source={source}: its final checkpoint {path.name} (step {summary.step}) is gone; "
            "train the source again (remove its summary.json, then relaunch it) or evaluate another run"
        )
    return {"run_id": summary.run_id, "step": summary.step, "sha256": checkpoint_digest(path)}


def read_summary(run_dir: Path) -> RunSummary | None:
    """The summary, or None where there is none or it does not parse (the run resumes from its checkpoints)."""
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return RunSummary.from_dict(summary) if isinstance(summary, dict) else None


def write_summary(run_dir: Path, summary: RunSummary) -> None:
    text = json.dumps(summary.to_dict(), indent=2, default=str)
    atomic_write(run_dir / SUMMARY, lambda tmp: tmp.write_text(text))


def base_summary(cfg: DictConfig) -> RunSummary:
    """The identity fields every summary.json carries (what the analysis groups by)."""
    counts = param_counts(cfg.model)
    return RunSummary.from_dict(
        {
            "status": RunStatus.RUNNING,
            "run_id": run_id(cfg),
            "config_id": config_id(cfg),  # shared by runs that differ only in seed: what the analysis averages over
            "label": run_label(cfg),
            "stage": cfg.stage.name,
            "variant": variant(cfg.model),
            **({"stage_variant": cfg.stage.variant} if cfg.stage.get("variant") else {}),
            "seed": cfg.seed,
            "model": OmegaConf.to_container(cfg.model, resolve=True),
            "trainer": OmegaConf.to_container(cfg.trainer, resolve=True),
            "data": cfg.data.name,
            "params_stored": counts["stored"],
            "params_effective": counts["effective"],
        }
    )


def with_source(cfg: DictConfig) -> DictConfig:
    """`cfg` with the model, data, recipe and seed of the run `stage.source` names, `evaluated` its final checkpoint."""
    source = cfg.stage.source
    if not source:
        raise ConfigError("an evaluate stage needs the trained run: stage.source=<run folder>")
    saved = Path(source) / CONFIG
    if not saved.exists():
        raise ConfigError(f"stage.source={source} holds no config.yaml; point it at a trained run's folder")
    if cfg.stage.eval_n_loops is None:
        raise ConfigError("an evaluate stage needs the inference R: stage.eval_n_loops=<R>")
    trained = OmegaConf.masked_copy(cast(DictConfig, OmegaConf.load(saved)), ["model", "data", "trainer", "seed"])
    out = cast(DictConfig, OmegaConf.merge(cfg, trained))
    out.evaluated = EvaluatedConfig(**source_checkpoint(Path(source)))
    return out
