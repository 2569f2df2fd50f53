"""The fixed option lists of the schema: one StrEnum per setting with named choices (the schedule's are in
cart_sweeps.schedule). OmegaConf refuses a typo at compose time; a StrEnum is written as its plain string.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from cart_sweeps.hardware import PEAK_BF16_FLOPS


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
    tensorboard = "tensorboard"


class LoggerMode(StrEnum):
    offline = "offline"
    online = "online"  # needs W&B credentials (WANDB_API_KEY or `wandb login`)


class StageKind(StrEnum):
    train = "train"
    evaluate = "evaluate"  # no training: a trained run evaluated at another loop count

    @classmethod
    def of(cls, cfg: Any) -> StageKind:
        return cls(cfg.stage.kind)

    @property
    def trains(self) -> bool:  # its runs cost training tokens, check their schedule, log W&B runs
        return self is StageKind.train

    @property
    def reads_checkpoint(self) -> bool:  # stage.source's (part of its runs' identity), measured with harness.tasks
        return self is StageKind.evaluate


class StageRole(StrEnum):
    """The paper's parts of the study (the analysis's tables and the demo read them): a near miss is refused."""

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
    """How a stage chooses its runs: its grid, or an Optuna sampler over its search space (sweep.samplers)."""

    grid = "grid"  # every point of stage.grid
    tpe = "tpe"  # TPESampler (MOTPE with several objectives)
    random = "random"  # RandomSampler
    gp = "gp"  # GPSampler: Gaussian-process Bayesian optimization (torch, scipy)
    cmaes = "cmaes"  # CmaEsSampler (the `cmaes` package): numeric parameters, one objective
    nsga2 = "nsga2"  # NSGAIISampler: a genetic algorithm, for several objectives
    qmc = "qmc"  # QMCSampler: a scrambled Sobol sequence


class StageNumbers(StrEnum):
    """Which scale a stage file's numbers are in (sweep/scale.py): the paper's, or the run's own."""

    paper = "paper"
    own = "own"


class PlanFormat(StrEnum):
    table = "table"
    csv = "csv"


# The GPUs plan can cost a stage on (members from a runtime table, which mypy cannot list).
GPU = StrEnum("GPU", {name: name for name in PEAK_BF16_FLOPS})  # type: ignore[misc]


class Pruner(StrEnum):
    """How a search stops unpromising trials early (Optuna's pruners); OmegaConf reads a member by its name."""

    none = "none"
    median = "median"  # MedianPruner: worse than the median of earlier trials at the same step
    hyperband = "hyperband"  # HyperbandPruner: successive halving over brackets of run lengths
