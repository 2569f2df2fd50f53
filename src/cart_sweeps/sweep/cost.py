"""What a run costs before it runs, and the order a stage launches its runs in (`launch_set`: as the driver
launches them and `plan` lists them).

Cost: parameters, training tokens and FLOPs, and hours at an assumed MFU, or at the throughput measured
on finished runs of the same shape where there are any. Order: longest first, which list scheduling turns
into a makespan within a few percent of the lower bound (grid order starts the widest runs last).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial

from cart_sweeps.config import ConfigError
from cart_sweeps.hardware import PEAK_BF16_FLOPS
from cart_sweeps.model import param_counts, train_flops_per_token
from cart_sweeps.modelspec import spec_of
from cart_sweeps.options import StageKind
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.stagerecord.results import Held, Results
from cart_sweeps.status import RunStatus

if TYPE_CHECKING:
    from cart_sweeps.sweep.expand import Run, Stage


@dataclass(frozen=True)
class Cost:
    params_stored: int
    params_effective: int
    tokens: int  # training tokens (0 for an evaluation)
    flops: float  # training FLOPs
    gpu_hours: float


def assumed_flops_per_s(gpu: str, mfu: float) -> float:
    """Sustained FLOP/s assumed for planning: the GPU's dense bf16 peak times the assumed MFU."""
    if gpu not in PEAK_BF16_FLOPS:
        raise ConfigError(f"plan.gpu={gpu!r} is not allowed; use one of {sorted(PEAK_BF16_FLOPS)}")
    if not 0 < mfu <= 1:
        raise ConfigError(f"plan.mfu={mfu} must be in (0, 1]")
    return PEAK_BF16_FLOPS[gpu] * mfu


def _shape(cfg: DictConfig) -> tuple[str, int]:
    """What a run's throughput depends on most: the model and its width."""
    return cfg.model.name, cfg.model.d_model


@dataclass(frozen=True)
class Throughput:
    """Sustained training FLOP/s per run shape: measured on finished runs of that shape, else assumed."""

    assumed: float
    measured: dict[tuple[str, int], float] = field(default_factory=dict)

    @classmethod
    def of(cls, results: Iterable[tuple[Run, RunSummary | None]], assumed: float) -> Throughput:
        """`assumed`, refined by the tokens/s that the completed ones of `results` (a run and the summary its
        folder holds) recorded."""
        rates: dict[tuple[str, int], list[float]] = {}
        # each configuration's shape and FLOPs per token, worked out once (not per seed)
        per_token: dict[str, tuple[tuple[str, int], float]] = {}
        for run, summary in results:
            if summary and summary.run_id == run.run_id and summary.status == RunStatus.COMPLETED:
                if tokens_per_s := summary.tokens_per_s:
                    if run.config.config_id not in per_token:
                        cfg = run.config.cfg
                        model = OmegaConf.to_object(cfg.model)  # a dataclass: read 6x faster than a DictConfig
                        flops = train_flops_per_token(model, cfg.trainer.seq_len)
                        per_token[run.config.config_id] = _shape(cfg), flops
                    shape, flops = per_token[run.config.config_id]
                    rates.setdefault(shape, []).append(tokens_per_s * flops)
        return cls(assumed, {shape: median(values) for shape, values in rates.items()})

    def flops_per_s(self, cfg: DictConfig) -> float:
        return self.measured.get(_shape(cfg), self.assumed)

    def measured_for(self, cfg: DictConfig) -> float | None:
        """The rate finished runs of `cfg`'s shape reached, None before any has finished."""
        return self.measured.get(_shape(cfg))


def run_cost(cfg: DictConfig, flops_per_s: float) -> Cost:
    model = OmegaConf.to_object(cfg.model)  # a dataclass: the counts read it 6x faster than a DictConfig
    counts = param_counts(model)
    t = cfg.trainer
    tokens = t.steps * t.micro_batch_size * t.grad_accum * t.seq_len if StageKind.of(cfg).trains else 0
    flops = train_flops_per_token(model, t.seq_len) * tokens
    return Cost(counts["stored"], counts["effective"], tokens, flops, flops / flops_per_s / 3600)


def run_costs(runs: Sequence[Run], throughput: Throughput) -> dict[str, Cost]:
    """Run id -> its estimated cost at the throughput of its shape (each configuration costed once)."""
    costs: dict[str, Cost] = {}
    for run in runs:
        if run.config.config_id not in costs:
            cfg = run.config.cfg
            costs[run.config.config_id] = run_cost(cfg, throughput.flops_per_s(cfg))
    return {run.run_id: costs[run.config.config_id] for run in runs}


def launch_order(runs: Sequence[Run], costs: Mapping[str, Cost]) -> list[Run]:
    """`runs` longest first by estimated hours (ties keep the stage's order): what the driver launches first."""
    return sorted(runs, key=lambda run: -costs[run.run_id].gpu_hours)


@dataclass(frozen=True)
class LaunchSet:
    """The runs a launch of a stage knows (the grid's or a search's so far, and those its rule added: `why`),
    where their results are, and their costs."""

    runs: list[Run]
    why: dict[str, str]
    held: dict[str, Held | None]
    throughput: Throughput
    costs: dict[str, Cost]

    @property
    def in_order(self) -> list[Run]:
        return launch_order(self.runs, self.costs)


def launch_set(stage: Stage, history: dict[str, list[FrozenTrial]], results: Results) -> LaunchSet:
    """The stage's launch set, from its ledger's `history` and where `results` finds each run's result: the one
    set-up the driver runs and `plan` lists."""
    earlier = stage.rule.earlier(history)
    runs = [*stage.known_runs(history), *(a.run for a in earlier)]
    held = results.held_each(runs, history)
    plan = stage.base.plan
    throughput = Throughput.of(
        ((run, h.summary if (h := held[run.run_id]) else None) for run in runs),
        assumed_flops_per_s(plan.gpu, plan.mfu),
    )
    return LaunchSet(runs, {a.run.run_id: a.why for a in earlier}, held, throughput, run_costs(runs, throughput))


def makespan(hours: Sequence[float], slots: int) -> float:
    """Wall time of list scheduling `hours` in this order on `slots` slots: each job to the first free slot."""
    free = [0.0] * slots
    for h in hours:
        heapq.heappush(free, heapq.heappop(free) + h)
    return max(free)


def makespan_bound(hours: Sequence[float], slots: int) -> float:
    """No schedule beats max(total / slots, longest job)."""
    return max(sum(hours) / slots, max(hours, default=0.0))


GIB = 2**30
CUDA_OVERHEAD_BYTES = GIB  # CUDA context, allocator slack and compile workspace, per process


def memory_need_bytes(cfg: DictConfig) -> int:
    """A generous estimate of one training run's peak GPU memory, to decide how many runs share a GPU.

    fp32 weights, gradients and AdamW's two moments (16 bytes a stored parameter); the bf16 activations a
    block keeps for backward, 34 bytes per token and width with flash attention (Korthikanti et al. 2022,
    "Reducing Activation Recomputation", s b h (34 + 5 a s / h) without the attention-score term), for
    each block a forward pass applies; the bf16 logits and their gradient (the loss upcasts one chunk at
    a time); and the process's CUDA overhead.
    """
    m, t = cfg.model, cfg.trainer
    tokens = t.micro_batch_size * t.seq_len
    blocks = spec_of(m).blocks(m)
    state = 16 * param_counts(m)["stored"]
    activations = 34 * tokens * m.d_model * blocks
    logits = 2 * 2 * tokens * m.vocab_size
    return state + activations + logits + CUDA_OVERHEAD_BYTES
