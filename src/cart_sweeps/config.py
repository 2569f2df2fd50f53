"""Typed schema of every config group (registered by cart_sweeps.register): an unknown key or a wrong type in
conf/ or sweeps/ fails at compose time. Value checks types cannot express are in cart_sweeps.validate; the roles
each key plays are stated on its field (`keys_with`). Registers the `cache_home` resolver DataConfig's default names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from cart_sweeps.metric import DEFAULT as DEFAULT_METRIC
from cart_sweeps.options import (
    GPU,
    CandidateSelection,
    CoreUpdate,
    Device,
    LoggerMode,
    LoggerName,
    Optimizer,
    PlanFormat,
    Precision,
    Pruner,
    Sampler,
    StageKind,
    StageNumbers,
    TokenizerKind,
)
from cart_sweeps.schedule import DecayShape, LRSchedule

REPO_ROOT = Path(__file__).resolve().parents[2]
# The repo's conf/ and sweeps/, through the package's links to them (copies of them in an installed wheel).
CONF_DIR = (Path(__file__).parent / "conf").resolve()
SWEEPS_DIR = (Path(__file__).parent / "sweeps").resolve()

MAX_LOOPS = 16  # rows of the loop-index embedding table: the largest R a model can run


class ConfigError(ValueError):
    """A user-fixable config problem; its message is one line naming the key and the fix."""


ABLATION = {"ablation": True}  # field metadata: an ablation switch of the model

# The roles a config key plays, stated once on its field (metadata) and listed by `keys_with`.
OPERATIONAL = {"operational": True}  # where or how fast a run goes, not what it computes: not in its identity
RECIPE = {"recipe": True}  # the training recipe: runs that differ in one are never pooled into one comparison
AFTER_BRANCH = {"after_branch": True}  # shapes only the decay after a branch step, or what is measured: a
# branch may differ from its parent in it (docs/wsd.md)
AXIS = {"axis": True}  # a coordinate of the study's model grid: a cell of every table (analysis/load.py)
DRIVER = {"driver": True}  # a root group of how a stage drives, costs or times its runs, not what a run is
REPORTING = {"reporting": True}  # a root group of where runs report (their folders, their logger)


def keys_with(schema: type, *roles: dict[str, bool]) -> tuple[str, ...]:
    """The fields of a schema dataclass that play any of `roles`, in the schema's order."""
    return tuple(f.name for f in fields(schema) if any(f.metadata.get(name) for role in roles for name in role))


def rule(path: str) -> dict[str, str]:
    """StageConfig field metadata: the stage rule (cart_sweeps.rules) a stage setting this field runs, by path."""
    return {"rule": path}


def at_least(low: float) -> dict[str, float]:
    """Field metadata: the smallest value the field accepts, finite (`check_bounds`: before anything launches)."""
    return {"at_least": low}


def above(low: float, infinite: bool = False) -> dict[str, float]:
    """Field metadata: the field must be greater than `low` (`check_bounds`), and finite unless `infinite`."""
    return {"above": low} | ({"infinite": True} if infinite else {})


@dataclass
class ModelConfig:
    """A model's settings: conf/model/<name>.yaml states the MISSING ones. Each model carries every field (its run
    id hashes them all), so one model's shape key (n_layers: dense's) has its default here, not in its file."""

    name: str = MISSING  # a model registered in cart_sweeps/modelspec.py (SPECS)
    d_model: int = field(default=MISSING, metadata=at_least(1) | AXIS)
    head_dim: int = field(default=MISSING, metadata=at_least(2))
    n_prelude: int = field(default=6, metadata=at_least(0) | AXIS)
    n_loops: int = field(default=6, metadata=at_least(1) | AXIS)
    n_layers: int = field(default=12, metadata=at_least(1) | AXIS)  # dense only
    vocab_size: int = field(default=MISSING, metadata=at_least(2))
    max_seq_len: int = field(default=MISSING, metadata=at_least(1))
    norm_eps: float = field(default=1e-6, metadata=above(0))
    rope_base: float = field(default=10000.0, metadata=above(0))
    init_std: float = field(default=0.02, metadata=at_least(0))
    gate_init: float = 0.9  # sigmoid(a) at init
    core_update: CoreUpdate = CoreUpdate.reference
    # Ablation switches (REFERENCE.md section 4): a run with any of them on is labelled by them.
    unfreeze_kv: bool = field(default=False, metadata=ABLATION)
    unshare_core: bool = field(default=False, metadata=ABLATION)
    self_attn_core: bool = field(default=False, metadata=ABLATION)
    disable_hyper: bool = field(default=False, metadata=ABLATION)
    disable_lti: bool = field(default=False, metadata=ABLATION)
    disable_lie: bool = field(default=False, metadata=ABLATION)


@dataclass
class SourceConfig:
    """One text source read through `datasets` (a hub id or a local builder such as `json`)."""

    name: str = MISSING
    path: str = MISSING
    config_name: str | None = None
    split: str = "train"
    data_files: list[str] | None = None
    data_dir: str | None = None  # base of relative data_files; pkg://cart_sweeps/data/embedded: the shipped corpus
    text_field: str = "text"
    chunks_per_cycle: int = 1  # 1,024-token chunks this source contributes per interleave cycle
    revision: str | None = None  # hub sources: a commit sha, tag or branch to read (None: the default branch)


@dataclass
class ValSetConfig:
    """One validation set: the first `n_tokens` of a source, optionally after a seeded shuffle."""

    name: str = MISSING
    path: str = MISSING
    config_name: str | None = None
    split: str = "validation"
    data_files: list[str] | None = None
    data_dir: str | None = None  # as in SourceConfig
    text_field: str = "text"
    last_docs: int | None = None  # keep only the last N documents (read without streaming)
    shuffle_seed: int | None = None  # documents in random.Random(seed).shuffle order (read without streaming)
    n_tokens: int = 500_000
    revision: str | None = None  # hub sources: a commit sha, tag or branch to read (None: the default branch)


@dataclass
class TokenizerConfig:
    kind: TokenizerKind = MISSING  # hub: a pretrained tokenizer by name; bpe: trained on the sources
    name: str = MISSING
    vocab_size: int = MISSING  # hub: must equal the tokenizer's; bpe: the size to train (at most 65,536: uint16 bins)
    bos_token: str = "<s>"
    eos_token: str = "</s>"
    train_docs: int | None = None  # bpe: train on at most this many documents of each source (None: all)
    revision: str | None = None  # hub: the tokenizer repo's commit sha, tag or branch (None: the default branch)


@dataclass
class DataConfig:
    name: str = MISSING
    cache_dir: str = field(default="${cache_home:}/data", metadata=OPERATIONAL)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    sources: list[SourceConfig] = MISSING
    validation: list[ValSetConfig] = MISSING
    chunk_tokens: int = field(default=MISSING, metadata=at_least(1))
    train_tokens: int | None = None  # stop the interleave here (None: when a source runs out)
    streaming: bool = field(default=True, metadata=OPERATIONAL)


IN_STEPS = {"in_steps": True}  # field metadata: a count of steps, shrunk with the run's length by a scale


@dataclass
class TrainerConfig:
    """The training recipe: conf/trainer/paper.yaml states the MISSING ones."""

    steps: int = field(default=MISSING, metadata=IN_STEPS | at_least(1) | RECIPE | AFTER_BRANCH)
    seq_len: int = field(default=MISSING, metadata=at_least(1))
    micro_batch_size: int = field(default=MISSING, metadata=at_least(1))
    grad_accum: int = field(default=MISSING, metadata=at_least(1))
    optimizer: Optimizer = MISSING
    lr: float = field(default=MISSING, metadata=above(0) | RECIPE)
    min_lr: float = field(default=MISSING, metadata=at_least(0) | RECIPE | AFTER_BRANCH)
    warmup_steps: int = field(default=MISSING, metadata=IN_STEPS | at_least(0) | RECIPE)
    betas: list[float] = MISSING
    weight_decay: float = field(default=MISSING, metadata=at_least(0) | RECIPE)
    # the paper decays every parameter; false spares norms, gate, HC logits, LIE
    decay_all: bool = field(default=MISSING, metadata=RECIPE)
    grad_clip: float = field(default=MISSING, metadata=above(0, infinite=True))  # inf: no clipping
    precision: Precision = MISSING
    # null: compile runs long enough to repay it (train/setup.py, COMPILE_MIN_STEPS)
    compile: bool | None = field(default=None, metadata=OPERATIONAL)
    device: Device = field(default=Device.auto, metadata=OPERATIONAL)
    threads: int = field(default=0, metadata=at_least(0) | OPERATIONAL)  # torch CPU threads; 0 leaves torch's default
    deterministic: bool = False
    eval_every: int = field(default=MISSING, metadata=IN_STEPS | at_least(1) | AFTER_BRANCH)
    eval_windows: int = field(default=MISSING, metadata=at_least(1) | AFTER_BRANCH)
    eval_batch_size: int = field(default=MISSING, metadata=at_least(1) | OPERATIONAL)
    log_every: int = field(default=MISSING, metadata=IN_STEPS | at_least(1) | OPERATIONAL)
    ckpt_every: int = field(default=MISSING, metadata=IN_STEPS | at_least(1) | OPERATIONAL)
    # newest checkpoints kept per run; 0 keeps all
    keep_checkpoints: int = field(default=2, metadata=at_least(0) | OPERATIONAL)
    # true: a finished run keeps its optimizer state and earlier checkpoints too (to train it further)
    keep_final_optimizer: bool = field(default=False, metadata=OPERATIONAL)
    # The learning-rate schedule (schedule.Schedule): the paper's cosine, or warm-up-stable-decay (docs/wsd.md)
    schedule: LRSchedule = field(default=LRSchedule.cosine, metadata=RECIPE)
    # wsd: the share of the steps that decay
    decay_fraction: float = field(default=0.2, metadata=at_least(0) | RECIPE | AFTER_BRANCH)
    # wsd: how the decay falls to min_lr
    decay_shape: DecayShape = field(default=DecayShape.sqrt, metadata=RECIPE | AFTER_BRANCH)
    # steps whose full checkpoint is kept for branches
    keep_checkpoints_at: list[int] = field(default_factory=list, metadata=OPERATIONAL)
    # a run folder: start from its checkpoint at branch_step, not from step 0 (wsd)
    branch_from: str | None = field(default=None, metadata=OPERATIONAL)
    # None: the earlier of the two decay starts
    branch_step: int | None = field(default=None, metadata=at_least(1) | OPERATIONAL)


@dataclass
class LoggerConfig:
    name: LoggerName = MISSING  # each conf/logger file names its logger
    project: str = "cart-sweeps"
    entity: str | None = None
    mode: LoggerMode = LoggerMode.offline  # never prompts


@dataclass
class LauncherConfig:
    """What every launcher has: `_target_` names its pool class (sweep.pool.Pool), whose module subclasses this
    with its other settings. conf/launcher/<name>.yaml states every value: the group composes untyped, and
    preflight types it by the pool's subclass."""

    _target_: str = MISSING
    poll_s: float = field(default=MISSING, metadata=at_least(1e-3))  # how often the driver checks its jobs
    timeout_min: int = field(default=MISSING, metadata=at_least(1))  # a job's wall-time limit
    setup: list[str] = MISSING  # shell lines run before each job (module loads, venvs)
    # Launch a stage at scale=paper where its runs get no GPU (docs/scale.md); a safety switch, so a default.
    allow_cpu: bool = False


@dataclass
class ScaleConfig:
    """How a stage's paper numbers map onto this scale (identity at `paper`)."""

    name: str = "paper"
    d_model: dict[int, int] = field(default_factory=dict)  # paper width -> width at this scale
    head_dim: int = 64
    steps: dict[int, int] = field(default_factory=dict)  # paper run lengths -> this scale's: the knots of `steps_at`
    steps_divisor: int = 1  # run lengths where `steps` is empty; a wsd run's warm-up at every length
    seq_len_divisor: int = 1
    batch_divisor: int = 1
    fold_accumulation: bool = False  # one micro-batch of micro_batch_size x grad_accum: the tokens per step kept
    eval_every: int | None = None  # fixed eval interval (None: scaled with the run length)
    eval_windows: int | None = None
    paper: dict[str, Any] = field(default_factory=dict)  # a stage run: the paper numbers of the keys its scale changed


@dataclass
class StageConfig:
    """A stage of the study (sweeps/<name>.yaml): a grid of override keys over a fixed recipe, times its variants
    (a variant may ask for `dense_parity: stored|effective`); `search`: key -> {low, high, log} or {choices},
    optionally with `when: {key: choice}` (checked by sweep.space, so any value composes)."""

    name: str = "single"
    kind: StageKind = StageKind.train
    role: str | None = None  # its part in the paper's study: a role the paper's tables read (None: in none)
    quick: list[str] = field(default_factory=list)  # `python -m cart_sweeps.demo --quick`: overrides narrowing it
    grid: dict[str, list[Any]] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)
    # The scale its grid, recipe and variants are written in: the paper's or the run's own (docs/scale.md)
    numbers: StageNumbers = StageNumbers.paper
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    search: dict[str, Any] = field(default_factory=dict)
    # The most runs it may have (a grid's product, a search's sweep.n_trials): more is refused before any is listed
    max_runs: int = 100_000
    select: CandidateSelection = CandidateSelection.paper
    zoom_from: str = "1"  # select=zoom|best: the stage whose ledger ranks the candidates (best: each width's best run)
    source: str | None = None  # evaluate stages: the run folder of the trained model
    eval_n_loops: int | None = None  # evaluate stages: the inference R
    num_fewshot: int | None = None  # evaluate stages: lm-eval's shot count (None: each task's own, 0 for the paper's)
    # Seeds where a decision needs them (rules/seeds.py; docs/statistics.md); off by default.
    replicates: int = 0  # a one-seed screen: per width, its K best configurations re-run with 2 more seeds
    max_seeds: int | None = None  # a seed axis: seeds added to a width's cells while its best R is undecided
    sentinels: int = 0  # select=zoom: per width, also the K configurations ranked just below the cutoff
    # A relative margin inside which options are decided equivalent (docs/statistics.md); None: no margin
    equivalence: float | None = None
    # A ladder of horizons (rules/ladder.py, docs/ladder.md): each run's trainer.steps, paper numbers; [] for none
    rungs: list[int] = field(default_factory=list, metadata=rule("cart_sweeps.rules.ladder.LadderRule"))
    # a gap's change per unit of ln(horizon) before two rungs, and zoom's from screen to confirm (None: the paper's)
    drift: float | None = None
    branch: bool = False  # trainer.schedule=wsd: a promoted run branches from the previous rung's stable phase
    # Set by the sweep: the keys its runs differ in that a label does not always show (trainer.lr): run_label adds them
    varied: list[str] = field(default_factory=list)
    # Set by the sweep: the name of the stage's variant this run is (single_loop), recorded in its summary
    variant: str | None = None


@dataclass
class SweepConfig:
    sampler: Sampler = Sampler.grid
    # a search (any sampler but grid: sweep/samplers.py): its trials, repeats among them (sweep/search_trials.py)
    n_trials: int | None = None
    startup_trials: int = 10  # a search: trials sampled at random before its sampler (and the pruner) learn
    pruner: Pruner = Pruner.none  # a search only
    metric: str = DEFAULT_METRIC
    # several objectives: a multi-objective ledger, the first the ranking metric (sweep/objectives.py); [] for one
    metrics: list[str] = field(default_factory=list)
    # minimize | maximize; None: the metric's own (cart_sweeps/metric.py), which a setting must agree with
    direction: str | None = None
    max_retries: int = 1
    # sqlite: runs/<stage>/ledger.db; journal: Optuna's JournalStorage (file systems where SQLite locking is
    # unsafe); or one storage several stages share, one study per stage: a SQLite file (study.db) or a URL
    storage: str = "sqlite"


@dataclass
class BenchConfig:
    warmup: int = 3
    steps: int = 10


@dataclass
class PlanConfig:
    """`python -m cart_sweeps.plan`: how to cost a stage and print it."""

    gpu: GPU = GPU("h100")  # peak dense bf16 FLOP/s: hardware.PEAK_BF16_FLOPS
    mfu: float = 0.35  # assumed model FLOPs utilisation
    format: PlanFormat = PlanFormat.table
    slots: int | None = None  # slots for the simulated makespan (None: the stage's launcher's)


@dataclass
class PathsConfig:
    runs: str = "${oc.env:CART_SWEEPS_RUNS,runs}"


@dataclass
class HarnessConfig:
    """lm-eval benchmarks run by evaluate stages beside perplexity (cart_sweeps.harness); [] for none."""

    tasks: list[str] = field(default_factory=lambda: ["hellaswag", "arc_challenge", "lambada_openai", "piqa"])
    limit: int | None = field(default=None, metadata=at_least(1))  # questions per task (None: all)
    batch_size: int = field(default=8, metadata=at_least(1))  # the paper's


@dataclass
class EvaluatedConfig:
    """The checkpoint an evaluate run reads, from stage.source (runfolder.with_source): part of its identity."""

    run_id: str | None = None  # the source run's id
    step: int = MISSING  # its final step
    sha256: str = MISSING  # that checkpoint file's digest


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig, metadata=REPORTING)
    # conf/launcher/<name>.yaml, typed by its pool's LauncherConfig (Pool.settings_of)
    launcher: Any = field(default=MISSING, metadata=DRIVER)
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    stage: StageConfig = field(default_factory=StageConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig, metadata=DRIVER)
    paths: PathsConfig = field(default_factory=PathsConfig, metadata=REPORTING)
    bench: BenchConfig = field(default_factory=BenchConfig, metadata=DRIVER)
    plan: PlanConfig = field(default_factory=PlanConfig, metadata=DRIVER)
    seed: int = 42
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    evaluated: EvaluatedConfig | None = None  # evaluate stages: set from stage.source


RECIPE_KEYS = keys_with(TrainerConfig, RECIPE)
DRIVER_GROUPS = keys_with(Config, DRIVER)  # a stage keeps their overrides to itself; a W&B record leaves them out
ABLATION_SWITCHES = keys_with(ModelConfig, ABLATION)


def cache_home() -> str:
    """$CART_SWEEPS_CACHE, else the per-user cache ($XDG_CACHE_HOME/cart_sweeps or ~/.cache/cart_sweeps)."""
    if root := os.environ.get("CART_SWEEPS_CACHE"):
        return root
    return str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cart_sweeps")


OmegaConf.register_new_resolver("cache_home", cache_home, replace=True)
