"""Typed schema of every config group, registered with Hydra's ConfigStore.

The YAML files in conf/ and sweeps/ are validated against these dataclasses at compose time, so an
unknown key or a wrong type fails before anything runs. Value checks that types cannot express
(d divisible by the head dim, R within the loop-index table, ...) live in `validate`. Which values
name a run (`identity`, `run_id`, `config_id`) is decided in cart_sweeps.identity; its label and folder in
cart_sweeps.naming.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

import omegaconf.base
from omegaconf import MISSING, DictConfig, OmegaConf

from cart_sweeps.hardware import PEAK_BF16_FLOPS

REPO_ROOT = Path(__file__).resolve().parents[2]
# The repo's conf/ and sweeps/, through the package's links to them (copies of them in an installed wheel).
CONF_DIR = (Path(__file__).parent / "conf").resolve()
SWEEPS_DIR = (Path(__file__).parent / "sweeps").resolve()

MAX_LOOPS = 16  # rows of the loop-index embedding table: the largest R a model can run


class ConfigError(ValueError):
    """A user-fixable config problem; its message is one line naming the key and the fix."""


# Fixed option lists. OmegaConf checks an Enum-typed field at compose time ("Invalid value 'x', expected
# one of [...]"), so a typo fails before anything runs; a StrEnum compares equal to its value and is
# written to YAML, JSON and the ledger as that plain string, so run ids and files are unchanged.
class ModelName(StrEnum):
    cart = "cart"
    dense = "dense"


class CoreUpdate(StrEnum):
    reference = "reference"  # the author's code: h = (1 + sigmoid(a)) h_in + delta
    paper = "paper"  # the paper's equation: h = sigmoid(a) h_in + delta


class TokenizerKind(StrEnum):
    hub = "hub"
    bpe = "bpe"


class Optimizer(StrEnum):
    adamw = "adamw"
    adamw8bit = "adamw8bit"  # bitsandbytes: CUDA, or the CPU from 0.50 (train/eightbit.py)


class Precision(StrEnum):
    auto = "auto"  # bf16 on CUDA, fp32 on CPU
    bf16 = "bf16"
    fp32 = "fp32"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class LoggerName(StrEnum):
    none = "none"
    wandb = "wandb"


class LoggerMode(StrEnum):
    offline = "offline"
    online = "online"  # needs W&B credentials (WANDB_API_KEY or `wandb login`)


class StageKind(StrEnum):
    train = "train"
    evaluate = "evaluate"  # no training: a trained run evaluated at another loop count


class StageRole(StrEnum):
    """The part a stage plays in the paper's study: what the analysis reads its runs as, and the demo runs."""

    screen = "screen"  # Stage 1
    confirm = "confirm"  # Stage 2
    parity = "parity"
    ablations = "ablations"
    variable_r = "variable_r"
    benchmarks = "benchmarks"


class CandidateSelection(StrEnum):
    paper = "paper"  # the stage's fixed grid
    zoom = "zoom"  # candidates ranked from an earlier stage's ledger
    best = "best"  # each width's best run of an earlier stage (its ledger), as the trained run to evaluate


class Sampler(StrEnum):
    grid = "grid"
    tpe = "tpe"


class PlanFormat(StrEnum):
    table = "table"
    csv = "csv"


# The GPUs plan can cost a stage on (members from a runtime table, which mypy cannot list).
GPU = StrEnum("GPU", {name: name for name in PEAK_BF16_FLOPS})  # type: ignore[misc]


ABLATION = {"ablation": True}  # field metadata: an ablation switch of the model


def at_least(low: float) -> dict[str, float]:
    """Field metadata: the smallest value the field accepts (`check_bounds`: before anything launches)."""
    return {"at_least": low}


def above(low: float) -> dict[str, float]:
    """Field metadata: the field must be greater than `low` (`check_bounds`)."""
    return {"above": low}


@dataclass
class ModelConfig:
    name: ModelName = ModelName.cart
    d_model: int = field(default=1024, metadata=at_least(1))
    head_dim: int = field(default=64, metadata=at_least(2))
    n_prelude: int = field(default=6, metadata=at_least(0))
    n_loops: int = field(default=6, metadata=at_least(1))
    n_layers: int = field(default=12, metadata=at_least(1))  # dense only
    vocab_size: int = field(default=32000, metadata=at_least(2))
    max_seq_len: int = field(default=1024, metadata=at_least(1))
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
    kind: TokenizerKind = TokenizerKind.hub  # hub: a pretrained tokenizer by name; bpe: trained on the sources
    name: str = "NousResearch/Llama-2-7b-hf"
    vocab_size: int = 32000  # hub: must equal the tokenizer's; bpe: the size to train (at most 65,536: uint16 bins)
    bos_token: str = "<s>"
    eos_token: str = "</s>"
    train_docs: int | None = None  # bpe: train on at most this many documents of each source (None: all)
    revision: str | None = None  # hub: the tokenizer repo's commit sha, tag or branch (None: the default branch)


@dataclass
class DataConfig:
    name: str = MISSING
    cache_dir: str = "${cache_home:}/data"
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    sources: list[SourceConfig] = field(default_factory=list)
    validation: list[ValSetConfig] = field(default_factory=list)
    chunk_tokens: int = field(default=1024, metadata=at_least(1))
    train_tokens: int | None = None  # stop the interleave here (None: when a source runs out)
    streaming: bool = True


IN_STEPS = {"in_steps": True}  # field metadata: a count of steps, shrunk with the run's length by a scale


@dataclass
class TrainerConfig:
    steps: int = field(default=30_500, metadata=IN_STEPS | at_least(1))
    seq_len: int = field(default=1024, metadata=at_least(1))
    micro_batch_size: int = field(default=8, metadata=at_least(1))
    grad_accum: int = field(default=4, metadata=at_least(1))
    optimizer: Optimizer = Optimizer.adamw
    lr: float = field(default=3e-4, metadata=above(0))
    min_lr: float = field(default=3e-5, metadata=at_least(0))
    warmup_steps: int = field(default=100, metadata=IN_STEPS | at_least(0))
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = field(default=0.1, metadata=at_least(0))
    decay_all: bool = True  # the paper decays every parameter; false spares norms, gate, HC logits, LIE
    grad_clip: float = field(default=1.0, metadata=above(0))
    precision: Precision = Precision.auto
    compile: bool | None = None  # null: compile on CUDA (the paper scale), not on the CPU
    device: Device = Device.auto
    threads: int = field(default=0, metadata=at_least(0))  # torch CPU threads; 0 leaves torch's default
    deterministic: bool = False
    eval_every: int = field(default=500, metadata=IN_STEPS | at_least(1))
    eval_windows: int = field(default=50, metadata=at_least(1))
    eval_batch_size: int = field(default=8, metadata=at_least(1))
    log_every: int = field(default=50, metadata=IN_STEPS | at_least(1))
    ckpt_every: int = field(default=5000, metadata=IN_STEPS | at_least(1))
    keep_checkpoints: int = field(default=2, metadata=at_least(0))  # newest checkpoints kept per run; 0 keeps all


@dataclass
class LoggerConfig:
    name: LoggerName = LoggerName.none
    project: str = "cart-sweeps"
    entity: str | None = None
    mode: LoggerMode = LoggerMode.offline  # never prompts


@dataclass
class LauncherConfig:
    """Where a stage's runs execute: `_target_` names the pool class (cart_sweeps.sweep.pool.Pool) that
    reads the rest. A new launcher is a pool module plus a subclass of this and its conf/launcher YAML."""

    _target_: str = MISSING
    poll_s: float = field(default=1.0, metadata=at_least(1e-3))  # how often the driver checks its jobs
    timeout_min: int = field(default=1440, metadata=at_least(1))  # a job's wall-time limit
    setup: list[str] = field(default_factory=list)  # shell lines run before each job (module loads, venvs)


@dataclass
class LocalLauncherConfig(LauncherConfig):
    """submitit processes on this machine: one slot per visible GPU (x runs_per_gpu), or `slots` without GPUs."""

    _target_: str = "cart_sweeps.sweep.pools.local.LocalPool"
    slots: int = field(default=1, metadata=at_least(1))
    runs_per_gpu: int = field(default=1, metadata=at_least(1))


@dataclass
class SlurmLauncherConfig(LauncherConfig):
    """submitit SLURM job arrays; sbatch options by name, any other one in `additional_parameters`."""

    _target_: str = "cart_sweeps.sweep.pools.slurm.SlurmPool"
    poll_s: float = field(default=5.0, metadata=at_least(1e-3))
    max_num_timeout: int = field(default=10, metadata=at_least(0))  # requeues after a timeout or preemption
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    constraint: str | None = None
    gpus_per_task: int = field(default=1, metadata=at_least(0))
    cpus_per_task: int = field(default=8, metadata=at_least(1))
    mem_gb: int = field(default=64, metadata=at_least(1))
    array_parallelism: int = field(default=64, metadata=at_least(1))
    signal_delay_s: int = field(default=120, metadata=at_least(0))
    # any other sbatch option, added by +launcher.additional_parameters.KEY=VALUE
    additional_parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScaleConfig:
    """How a stage's paper numbers map onto this scale (identity at `paper`)."""

    name: str = "paper"
    d_model: dict[int, int] = field(default_factory=dict)  # paper width -> width at this scale
    head_dim: int = 64
    steps: dict[int, int] = field(default_factory=dict)  # paper run length -> run length at this scale
    steps_divisor: int = 1  # run lengths not in `steps`
    seq_len_divisor: int = 1
    batch_divisor: int = 1
    eval_every: int | None = None  # fixed eval interval (None: scaled with the run length)
    eval_windows: int | None = None
    paper: dict[str, Any] = field(default_factory=dict)  # a stage run: the paper numbers of the keys its scale changed


@dataclass
class StageConfig:
    """A stage of the study: a grid of overrides over a fixed recipe (sweeps/<name>.yaml).

    Keys of `grid`, `recipe` and `variants` are override keys in the paper's numbers; the sweep maps
    them through `scale`. A run is one point of the product of the grid's axes, plus one variant when
    `variants` is set (a variant may ask for `dense_parity: stored|effective`, a dense depth derived
    from the CART model of the same point). `search` (sampler tpe): key -> {low, high, log}.
    """

    name: str = "single"
    kind: StageKind = StageKind.train
    role: StageRole | None = None  # its part in the paper's study (None: in no paper table)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    search: dict[str, dict[str, Any]] = field(default_factory=dict)
    select: CandidateSelection = CandidateSelection.paper
    zoom_from: str = "1"  # select=zoom|best: the stage whose ledger ranks the candidates (best: each width's best run)
    source: str | None = None  # evaluate stages: the run folder of the trained model
    eval_n_loops: int | None = None  # evaluate stages: the inference R
    num_fewshot: int | None = None  # evaluate stages: lm-eval's shot count (None: each task's own, 0 for the paper's)
    # Set by the sweep: the keys this stage's runs differ in that a label does not always show (trainer.lr, ...),
    # so each run's label, folder, summary and W&B name show them (run_label).
    varied: list[str] = field(default_factory=list)


class Pruner(StrEnum):
    """How a search stops its unpromising trials early, from their intermediate evaluations (Optuna's pruners).

    Members are named by their values: OmegaConf accepts an enum from the command line by name.
    """

    none = "none"
    median = "median"  # MedianPruner: worse than the median of earlier trials at the same step
    hyperband = "hyperband"  # HyperbandPruner: successive halving over brackets of run lengths


@dataclass
class SweepConfig:
    sampler: Sampler = Sampler.grid
    n_trials: int | None = None  # tpe only
    startup_trials: int = 10  # tpe only: trials sampled at random before TPE (and the pruner) learn; Optuna's default
    pruner: Pruner = Pruner.none  # tpe only
    metric: str = "ppl_wiki"
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
    """lm-eval benchmarks run by evaluate stages beside perplexity (src/cart_sweeps/harness); [] for none.

    `tasks` and `limit` are part of an evaluate run's identity (what it measures); `batch_size` is not.
    """

    tasks: list[str] = field(default_factory=lambda: ["hellaswag", "arc_challenge", "lambada_openai", "piqa"])
    limit: int | None = field(default=None, metadata=at_least(1))  # questions per task (None: all)
    batch_size: int = field(default=8, metadata=at_least(1))  # the paper's


@dataclass
class EvaluatedConfig:
    """The checkpoint an evaluate run reads, filled in from stage.source (runfolder.with_source), never by hand:
    part of the evaluation's identity, so another checkpoint of the source is another evaluation."""

    run_id: str | None = None  # the source run's id
    step: int = MISSING  # its final step
    sha256: str = MISSING  # that checkpoint file's digest


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = MISSING  # one of the subclasses above, chosen by the launcher group
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    stage: StageConfig = field(default_factory=StageConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    seed: int = 42
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    evaluated: EvaluatedConfig | None = None  # evaluate stages: set from stage.source


def check_bounds(node: Any, path: str) -> None:
    """The bounds the schema declares on a group's fields (`at_least`, `above` metadata): one line for the
    first value that cannot succeed. One walk for every group, so a bounded field needs no check of its own."""
    schema = type(node) if is_dataclass(node) else OmegaConf.get_type(node)
    if schema is None or not is_dataclass(schema):
        return
    for f in fields(schema):
        value = getattr(node, f.name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if (low := f.metadata.get("at_least")) is not None and value < low:
            raise ConfigError(f"{path}.{f.name}={value} must be >= {low:g}")
        if (low := f.metadata.get("above")) is not None and not value > low:
            raise ConfigError(f"{path}.{f.name}={value} must be > {low:g}")


def validate_model(m: DictConfig | ModelConfig) -> None:
    """Value checks on a model config, one clear line per problem."""
    check_bounds(m, "model")
    if m.d_model % m.head_dim:
        raise ConfigError(f"model.d_model={m.d_model} must be a positive multiple of model.head_dim={m.head_dim}")
    if m.head_dim % 2:
        raise ConfigError(f"model.head_dim={m.head_dim} must be even (RoPE rotates half of each head)")
    if m.name == ModelName.dense:
        return
    if m.d_model % 4:
        raise ConfigError(f"model.d_model={m.d_model} must be a multiple of 4 (the K/V latent is d/4 wide)")
    if not 0 < m.gate_init < 1:
        raise ConfigError(f"model.gate_init={m.gate_init} must be in (0, 1): it is sigmoid(a) at init")
    if m.n_loops > MAX_LOOPS and not m.disable_lie:
        raise ConfigError(f"model.n_loops={m.n_loops} must be in 1..{MAX_LOOPS} (the loop-index table's rows)")
    if m.self_attn_core and not m.unshare_core:
        raise ConfigError("model.self_attn_core=true needs model.unshare_core=true (the paper's ablation)")
    if m.self_attn_core and m.unfreeze_kv:
        raise ConfigError("model.unfreeze_kv=true does nothing with model.self_attn_core=true (no anchor)")


def _unknown_key(node: DictConfig, path: str) -> str | None:
    """The first key under `node` that its schema lacks, at any depth (`+` adds keys past a schema)."""
    schema = OmegaConf.get_type(node)
    if schema is None or not is_dataclass(schema):
        return None
    known = {f.name for f in fields(schema)}
    for key, child in node.items_ex(resolve=False):  # unresolved: this runs for every run of a stage
        if str(key) not in known:
            return f"{path}.{key!s}"
        if isinstance(child, DictConfig) and (found := _unknown_key(child, f"{path}.{key!s}")):
            return found
    return None


def check_settings(cfg: DictConfig) -> None:
    """A setting the schema lacks (`+model.n_loop=4`: a typo that + let in) is one line, before anything reads it."""
    for group in ("model", "data", "trainer"):
        if unknown := _unknown_key(cfg[group], group):
            parent, _, name = unknown.rpartition(".")
            known = [str(k) for k in cast(DictConfig, OmegaConf.select(cfg, parent)).keys() if k != name]
            close = difflib.get_close_matches(name, known, n=1)
            advice = f"did you mean {parent}.{close[0]}?" if close else "check its spelling (no + to set one)"
            raise ConfigError(f"+{unknown}: {parent} has no such setting; {advice}")


def validate(cfg: DictConfig) -> None:
    """Checks across the whole composed config that the schema's types cannot express."""
    check_settings(cfg)
    validate_model(cfg.model)
    for group in ("trainer", "data", "harness"):
        check_bounds(cfg[group], group)
    t = cfg.trainer
    if t.seq_len > cfg.model.max_seq_len:
        raise ConfigError(
            f"trainer.seq_len={t.seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}; "
            "lower one or raise the other"
        )


ABLATION_SWITCHES = tuple(f.name for f in fields(ModelConfig) if f.metadata.get("ablation"))


def cache_home() -> str:
    """$CART_SWEEPS_CACHE, else the per-user cache ($XDG_CACHE_HOME/cart_sweeps or ~/.cache/cart_sweeps), as
    HF datasets and torch keep theirs: every working folder shares one prepared copy of each recipe."""
    if root := os.environ.get("CART_SWEEPS_CACHE"):
        return root
    return str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cart_sweeps")


OmegaConf.register_new_resolver("cache_home", cache_home, replace=True)

# OmegaConf parses an interpolation's text (with ANTLR, 0.1-0.2 ms) each time it resolves it, and naming,
# validating and costing a stage's runs resolve the same few texts thousands of times (model.vocab_size,
# paths.runs). A parse tree depends on its text alone and resolving only reads it: trees are kept by text.
omegaconf.base.parse = functools.lru_cache(maxsize=1024)(omegaconf.base.parse)
