"""What a stage needs beyond each run's own config check, checked once before anything launches.

Each problem is one line naming the key and the fix (a ConfigError): the driver's own settings, the launcher's
settings typed by its pool (and what that pool needs of the runs: Pool.preflight), the sweep metric against the
validation sets the data measures, and what the machines must offer the runs (a CUDA GPU, or bitsandbytes' CPU
kernels, for AdamW8bit, a writable data cache, W&B credentials for online logging). A stage that cannot succeed is
refused whole, rather than launched and retried run by run.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from cart_sweeps.config import ConfigError
from cart_sweeps.data.manifest import check_prepared
from cart_sweeps.metric import BENCH, metric, per_set_names, require_error, run_wide_names
from cart_sweeps.options import StageKind
from cart_sweeps.sweep.expand import Stage
from cart_sweeps.sweep.ledger import check_direction, check_storage, ledger_path, sqlite_url
from cart_sweeps.sweep.pool import pool_class
from cart_sweeps.train.eightbit import adamw8bit_problem
from cart_sweeps.train.logger import check_credentials


def check_metric(name: str, cfg: DictConfig) -> None:
    """sweep.metric is a metric whose record says which way is better (cart_sweeps.metric) and that this config's
    runs report: a validation set's, a run-wide figure (tokens_per_s), or a score of one of its harness.tasks."""
    measured = [*per_set_names([v.name for v in cfg.data.validation]), *run_wide_names()]
    evaluates = cfg.stage.kind == StageKind.evaluate
    scored = evaluates and any(name.startswith(f"{BENCH}_{task}_") for task in cfg.harness.tasks)
    if name in measured or (scored and metric(name) is not None):
        return
    if scored:
        raise ConfigError(f"sweep.metric={name}: {require_error(name)}")
    scores = f", or {BENCH}_<task>_<measure> of harness.tasks" if evaluates else ""
    raise ConfigError(
        f"sweep.metric={name} is not measured with data={cfg.data.name}; use one of {', '.join(measured)}{scores}"
    )


def check_writable(folder: str, key: str) -> None:
    """Create the folder and a file in it, as a run will (root passes os.access checks that a write fails)."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ConfigError(f"{key}={folder} is not writable ({err.strerror}); point {key} at a writable folder") from err


def check_machine(cfg: DictConfig, no_gpu: str | None) -> None:
    """What one run config needs of the machines it runs on; `no_gpu`: why its runs get no CUDA GPU (Pool.no_gpu)."""
    t = cfg.trainer
    if t.optimizer == "adamw8bit" and cfg.stage.kind == "train":  # an evaluate stage steps no optimizer
        if problem := adamw8bit_problem(cuda=no_gpu is None and t.device != "cpu"):
            raise ConfigError(problem)
    if t.device == "cuda" and no_gpu is not None:
        raise ConfigError(f"trainer.device=cuda needs a CUDA GPU and {no_gpu}; use trainer.device=auto")
    check_credentials(cfg.logger)
    if cfg.stage.kind == "evaluate" and cfg.harness.tasks:
        check_harness(list(cfg.harness.tasks))


def check_harness(tasks: list[str]) -> None:
    """lm-eval is there, and the hub too unless every task is one of the shipped offline tasks."""
    from cart_sweeps.data.hub import hub_offline
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


def preflight(stage: Stage) -> None:
    """Every check above, for every run of the stage (each distinct setting once), and its pool's own."""
    check_direction(stage.base.sweep.metric, stage.base.sweep.direction)
    pool = pool_class(stage.base.launcher)
    launcher = pool.settings_of(stage.base.launcher)
    no_gpu = pool.no_gpu(launcher)
    storage = check_storage(stage.base.sweep.storage, stage.sweep_dir.parent)
    if (path := ledger_path(stage.sweep_dir, storage)) is not None and storage != "journal":
        sqlite_url(path)
    runs = stage.runs or [stage.run(next(stage.space.corners()))]  # a search: its recipe
    configs = list({id(run.config): run.config.cfg for run in runs}.values())  # a stage's seeds share one
    seen = set()
    for c in configs:  # an evaluate stage's runs carry their source's data, so each run's config is checked
        key = (c.data.name, c.data.cache_dir, c.trainer.optimizer, c.trainer.device, c.logger.name, c.logger.mode)
        key += tuple(c.harness.tasks)
        if key not in seen:
            seen.add(key)
            check_metric(stage.base.sweep.metric, c)
            check_writable(c.data.cache_dir, "data.cache_dir")
            check_prepared(c.data)
            check_machine(c, no_gpu)
    pool.preflight(launcher, configs)
