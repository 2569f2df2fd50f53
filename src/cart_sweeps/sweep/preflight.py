"""What a stage needs beyond each run's own config check, checked once before anything launches, each problem
one line naming the key and the fix (docs/faults.md; a paper-scale stage without a GPU: docs/scale.md). A stage
that cannot succeed is refused whole, rather than launched and retried run by run.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import ConfigError
from cart_sweeps.data.manifest import check_prepared
from cart_sweeps.data.recipe import LOCAL_BUILDERS, as_config, recipe_dir, recipe_hash
from cart_sweeps.hardware import this_machine
from cart_sweeps.metric import BENCH, metric, per_set_names, require_error, run_wide_names
from cart_sweeps.options import StageKind, TokenizerKind
from cart_sweeps.record.branch import branch_parent
from cart_sweeps.stagerecord.ledger import check_direction, check_storage, ledger_path, sqlite_url
from cart_sweeps.sweep.cost import Throughput, makespan, run_costs
from cart_sweeps.sweep.expand import Run, Stage
from cart_sweeps.sweep.objectives import objectives
from cart_sweeps.sweep.pool import capacity, pool_class
from cart_sweeps.sweep.scale import mapping_line
from cart_sweeps.text import duration
from cart_sweeps.train.eightbit import adamw8bit_problem
from cart_sweeps.train.logger import check_credentials


def check_metric(name: str, cfg: DictConfig) -> None:
    """sweep.metric is a metric whose record says which way is better (cart_sweeps.metric) and that this config's
    runs report: a validation set's, a run-wide figure (tokens_per_s), or a score of one of its harness.tasks."""
    measured = [*per_set_names([v.name for v in cfg.data.validation]), *run_wide_names()]
    evaluates = StageKind.of(cfg).reads_checkpoint
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
    if t.optimizer == "adamw8bit" and StageKind.of(cfg).trains:  # an evaluate stage steps no optimizer
        if problem := adamw8bit_problem(cuda=no_gpu is None and t.device != "cpu"):
            raise ConfigError(problem)
    if t.device == "cuda" and no_gpu is not None:
        raise ConfigError(f"trainer.device=cuda needs a CUDA GPU and {no_gpu}; use trainer.device=auto")
    check_credentials(cfg.logger)
    if StageKind.of(cfg).reads_checkpoint and cfg.harness.tasks:
        check_harness(list(cfg.harness.tasks))


def check_harness(tasks: list[str]) -> None:
    """lm-eval is there, and the hub too unless every task is one of the shipped offline tasks."""
    from cart_sweeps.data.recipe import hub_offline
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


def check_gpu(stage: Stage, runs: list[Run], no_gpu: str | None, allow_cpu: bool) -> None:
    """A training stage at the paper's scale is refused where its runs get no GPU (`no_gpu`: why, Pool.no_gpu),
    with this machine's estimated time for `runs` (a search: its recipe's run, n_trials times), unless
    `launcher.allow_cpu=true`. A SLURM launcher's runs get the
    cluster's GPUs: a driver on a machine without one is never refused for it."""
    if stage.base.scale.name != "paper" or not stage.train or no_gpu is None or allow_cpu or not runs:
        return
    machine = this_machine()
    costs = run_costs(runs, Throughput(machine.peak_flops * stage.base.plan.mfu))
    slots = capacity(stage.base.launcher)
    hours = makespan(sorted((costs[run.run_id].gpu_hours for run in runs), reverse=True), slots)
    raise ConfigError(
        f"stage {stage.name} is at scale=paper (the paper's widths and run lengths) and its runs get no GPU "
        f"({no_gpu}): about {duration(hours)} on {machine.name}, {slots} at a time; run the study shrunk for a "
        f"CPU with scale=tiny (`python -m cart_sweeps.plan stage={stage.option} scale=tiny` lists its runs and "
        "cost, nothing launched), or launch it here anyway with launcher.allow_cpu=true"
    )


def check_data_ready(data: DictConfig, passed: list[str]) -> None:
    """Data that only the hub gives is prepared before launch, else each run would stream it (or fail offline);
    local files the driver prepares itself (sweep/dataprep.py). `passed`: the command line's data settings."""
    cfg = as_config(data)
    if recipe_dir(cfg, recipe_hash(cfg)).exists():
        return
    hub = list(dict.fromkeys(s.path for s in [*cfg.sources, *cfg.validation] if s.path not in LOCAL_BUILDERS))
    hub += [cfg.tokenizer.name] if cfg.tokenizer.kind == TokenizerKind.hub else []
    if hub:
        command = " ".join(["python -m cart_sweeps.data.prepare", f"data={cfg.name}", *passed])
        raise ConfigError(
            f"data={cfg.name} is not prepared in {cfg.cache_dir}, and its runs would each read it from the hub "
            f"({', '.join(hub)}): prepare it once first with `{command}` (data=embedded, the tiny scale's, "
            "needs no preparing)"
        )


def changed_line(stage: Stage, configs: list[DictConfig]) -> str | None:
    """What the scale mapping changed of the stage's numbers, over its run configurations (a command-line value
    means what it says, so it is not listed)."""
    changed = [
        (key, paper, OmegaConf.select(c, key))
        for c in configs
        for key, paper in c.scale.paper.items()
        if key not in stage.args.passed
    ]
    return mapping_line(stage.name, stage.base.scale.name, changed)


def stage_configs(stage: Stage) -> tuple[list[Run], list[DictConfig]]:
    """The stage's runs (a search: its recipe's run) and their configs, each once (a stage's seeds share one)."""
    runs = stage.runs or [stage.run(next(stage.space.corners()))]
    return runs, list({id(run.config): run.config.cfg for run in runs}.values())


def check_stage_settings(stage: Stage, configs: list[DictConfig]) -> None:
    """The stage's own settings (its objectives, their direction, its ledger's storage, a branch_from given to
    its runs): `plan` checks them too, so a stage it plans is one the driver launches (machines and data aside)."""
    check_direction(stage.base.sweep.metric, stage.base.sweep.direction)
    storage = check_storage(stage.base.sweep.storage, stage.sweep_dir.parent)
    if (path := ledger_path(stage.sweep_dir, storage)) is not None and storage != "journal":
        sqlite_url(path)
    for c in configs:  # an evaluate stage's runs carry their source's data, so each run's config is checked
        for name in objectives(stage.base.sweep):
            check_metric(name, c)
        branch_parent(c)  # trainer.branch_from given to every run: each must be its parent's continuation


def preflight(stage: Stage) -> None:
    """Every check above, for every run of the stage (each distinct setting once), and its pool's own."""
    runs, configs = stage_configs(stage)
    check_stage_settings(stage, configs)
    pool = pool_class(stage.base.launcher)
    launcher = pool.settings_of(stage.base.launcher)
    no_gpu = pool.no_gpu(launcher)
    check_gpu(stage, stage.runs or runs * (stage.base.sweep.n_trials or 1), no_gpu, launcher.allow_cpu)
    data_settings = [o for k, o in stage.args.passed.items() if k.split(".")[0] == "data"]  # for `prepare`
    seen = set()
    for c in configs:
        key = (c.data.name, c.data.cache_dir, c.trainer.optimizer, c.trainer.device, c.logger.name, c.logger.mode)
        key += tuple(c.harness.tasks)
        if key not in seen:
            seen.add(key)
            check_writable(c.data.cache_dir, "data.cache_dir")
            check_prepared(c.data)
            check_data_ready(c.data, data_settings)
            check_machine(c, no_gpu)
    pool.preflight(launcher, configs)
    if line := changed_line(stage, configs):
        print(line, flush=True)
