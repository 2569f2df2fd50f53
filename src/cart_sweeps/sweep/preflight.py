"""What a stage needs beyond each run's own config check, checked once before anything launches.

Each problem is one line naming the key and the fix (a ConfigError): the driver's own settings, the sweep
metric against the validation sets the data measures, and what this machine must offer the runs (a CUDA
GPU, or bitsandbytes' CPU kernels, for AdamW8bit, a writable data cache, W&B credentials for online logging). A stage
that cannot succeed is refused whole, rather than launched and retried run by run.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import ConfigError
from cart_sweeps.data.manifest import checked_bins, read_manifest
from cart_sweeps.data.recipe import as_config, recipe_dir, recipe_hash
from cart_sweeps.hardware import gpu_memory_bytes
from cart_sweeps.record.summary import metric_names
from cart_sweeps.sweep.cost import GIB, memory_need_bytes
from cart_sweeps.sweep.expand import Stage
from cart_sweeps.sweep.ledger import check_storage, ledger_path, sqlite_url
from cart_sweeps.sweep.pool import pool_class
from cart_sweeps.train.eightbit import adamw8bit_problem
from cart_sweeps.train.logger import check_credentials
from cart_sweeps.validate import check_bounds


def check_launcher(launcher: DictConfig) -> None:
    """The bounds the launcher's schema declares (field metadata), and that its pool exists."""
    check_bounds(launcher, "launcher")
    pool_class(launcher)


def check_metric(metric: str, data: DictConfig) -> None:
    measured = metric_names([v.name for v in data.validation])
    if metric not in measured:
        raise ConfigError(
            f"sweep.metric={metric} is not measured with data={data.name}; use one of {', '.join(measured)}"
        )


def check_writable(folder: str, key: str) -> None:
    """Create the folder and a file in it, as a run will (root passes os.access checks that a write fails)."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ConfigError(f"{key}={folder} is not writable ({err.strerror}); point {key} at a writable folder") from err


def check_data(data: DictConfig) -> None:
    """A prepared cache whose bins changed since they were prepared (overwritten, truncated) is refused
    before launch; one never prepared is prepared by the first run."""
    cfg = as_config(data)
    digest = recipe_hash(cfg)
    folder = recipe_dir(cfg, digest)
    if folder.exists():
        checked_bins(folder, read_manifest(folder, cfg.name, digest), cfg.name)


def check_machine(cfg: DictConfig, gpus: list[str] | None) -> None:
    """What one run config needs of the machines it runs on; `gpus` are the local pool's (None on SLURM)."""
    t, lc = cfg.trainer, cfg.launcher
    no_gpu = not gpus if gpus is not None else OmegaConf.select(lc, "gpus_per_task", default=1) == 0
    where = "this machine has none visible" if gpus is not None else "launcher.gpus_per_task=0"
    if t.optimizer == "adamw8bit" and cfg.stage.kind == "train":  # an evaluate stage steps no optimizer
        if problem := adamw8bit_problem(cuda=not no_gpu and t.device != "cpu"):
            raise ConfigError(problem)
    if t.device == "cuda" and no_gpu:
        raise ConfigError(f"trainer.device=cuda needs a CUDA GPU and {where}; use trainer.device=auto")
    check_credentials(cfg.logger)
    if cfg.stage.kind == "evaluate" and cfg.harness.tasks:
        check_harness(list(cfg.harness.tasks))


def check_harness(tasks: list[str]) -> None:
    """lm-eval is there, and the hub too unless every task is one of the shipped offline tasks."""
    from cart_sweeps.data.sources import hub_offline
    from cart_sweeps.harness import SHIPPED_TASKS

    if importlib.util.find_spec("lm_eval") is None:
        raise ConfigError(
            "harness.tasks needs lm-eval: pip install 'cart_sweeps[eval]', or harness.tasks=[] for perplexity only"
        )
    if hub_offline() and (hub := [t for t in tasks if t not in SHIPPED_TASKS]):
        offline = ",".join(sorted(SHIPPED_TASKS - {"cart_tiny"}))
        raise ConfigError(
            f"harness.tasks: {','.join(hub)} read the hub, which is off (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE); "
            f"use the offline tasks harness.tasks=[{offline}] or harness.tasks=[]"
        )


def check_packing(runs_per_gpu: int, need: int, gpu_memory: int | None) -> None:
    """Runs packed onto one GPU (launcher.runs_per_gpu) must fit its memory by their estimated need."""
    if runs_per_gpu > 1 and gpu_memory is not None and runs_per_gpu * need > gpu_memory:
        raise ConfigError(
            f"launcher.runs_per_gpu={runs_per_gpu} packs runs that need up to {need / GIB:.1f} GiB each (estimated) "
            f"onto GPUs of {gpu_memory / GIB:.0f} GiB; lower launcher.runs_per_gpu"
        )


def preflight(stage: Stage, gpus: list[str] | None) -> None:
    """Every check above, for every run of the stage (each distinct setting once)."""
    check_launcher(stage.base.launcher)
    storage = check_storage(stage.base.sweep.storage)
    if (path := ledger_path(stage.sweep_dir, storage)) is not None and storage != "journal":
        sqlite_url(path)
    runs = stage.runs or [stage.run({k: d.low for k, d in stage.search.items()})]  # a search: its recipe
    configs = list({id(run.config): run.config.cfg for run in runs}.values())  # a stage's seeds share one
    seen = set()
    for c in configs:  # an evaluate stage's runs carry their source's data, so each run's config is checked
        key = (c.data.name, c.data.cache_dir, c.trainer.optimizer, c.trainer.device, c.logger.name, c.logger.mode)
        key += tuple(c.harness.tasks)
        if key not in seen:
            seen.add(key)
            check_metric(stage.base.sweep.metric, c.data)
            check_writable(c.data.cache_dir, "data.cache_dir")
            check_data(c.data)
            check_machine(c, gpus)
    if gpus and stage.base.launcher.runs_per_gpu > 1:  # the largest run's need against the smallest GPU
        memory = [m for m in gpu_memory_bytes(gpus) if m is not None]
        need = max(memory_need_bytes(c) for c in configs)
        check_packing(stage.base.launcher.runs_per_gpu, need, min(memory, default=None))
