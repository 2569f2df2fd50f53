"""What a metric is: one record per kind of number a run reports, read by everything that ranks, tests or plots.

A summary stores metrics flat by name: `<kind>_<set>` per validation set (ppl_austen), `bench_<task>_<measure>`
per lm-eval score, and the run-wide figures (tokens_per_s). A new metric is a `Kind` in KINDS (computed in
train/loop.py's evaluate_sets) or a row in BENCH_MEASURES.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Literal

DEFAULT = "ppl_wiki"  # the paper's ranking metric (sweep.metric's default)
BENCH = "bench"  # lm-eval scores: bench_<task>_<measure> (cart_sweeps.harness)
THROUGHPUT = "tokens_per_s"  # the run-wide training throughput: what the runs sharing its cores (or GPU) left it
RHO_LABEL = "gate ρ = sigmoid(a)"  # what `rho` is called for people: figures, the W&B panels, TensorBoard's cards


@dataclass(frozen=True)
class Kind:
    """A kind of measured number: how it is named, which way is better, what values it can take."""

    name: str  # ppl; a per-set metric is <name>_<set>, a run-wide one is named <name>
    label: str  # for people: "perplexity"
    unit: str  # "" where it has none
    higher_is_better: bool
    low: float  # the valid values: low < v (low <= v where low_inclusive) and v <= high
    high: float = math.inf
    low_inclusive: bool = False
    log_scale: bool = True  # seed noise scales with the level (compared as ratios); False: as differences
    per_set: bool = True  # one value per validation set
    resolution: float = 1e-9  # on the tested scale: seeds closer than this are not told apart (float rounding)


KINDS = (
    Kind("ppl", "perplexity", "", higher_is_better=False, low=1.0),  # exp(CE) with CE > 0: 1 is a perfect model
    Kind("bpb", "bits per byte", "bits/byte", higher_is_better=False, low=0.0),
    Kind("ce", "cross-entropy", "nats/token", higher_is_better=False, low=0.0),
    Kind(THROUGHPUT, "training throughput", "tokens/s", higher_is_better=True, low=0.0, per_set=False),
)
# lm-eval's measures, by the last part of bench_<task>_<measure>: accuracies are shares, compared as differences
BENCH_MEASURES = {
    "acc": Kind("acc", "accuracy", "", True, 0.0, 1.0, low_inclusive=True, log_scale=False),
    "acc_norm": Kind("acc_norm", "normalised accuracy", "", True, 0.0, 1.0, low_inclusive=True, log_scale=False),
    "exact_match": Kind("exact_match", "exact match", "", True, 0.0, 1.0, low_inclusive=True, log_scale=False),
    "f1": Kind("f1", "F1", "", True, 0.0, 1.0, low_inclusive=True, log_scale=False),
    "mcc": Kind("mcc", "Matthews correlation", "", True, -1.0, 1.0, low_inclusive=True, log_scale=False),
    "perplexity": Kind("perplexity", "perplexity", "", False, 1.0),
    "word_perplexity": Kind("word_perplexity", "word perplexity", "", False, 1.0),
    "byte_perplexity": Kind("byte_perplexity", "byte perplexity", "", False, 1.0),
    "bits_per_byte": Kind("bits_per_byte", "bits per byte", "bits/byte", False, 0.0),
}


@dataclass(frozen=True)
class Metric:
    """One named metric (ppl_austen, bench_cart_lastword_acc, tokens_per_s) and its kind."""

    name: str
    kind: Kind
    of: str  # what it was measured on: the validation set or lm-eval task ("" for a run-wide figure)

    @property
    def higher_is_better(self) -> bool:
        return self.kind.higher_is_better

    @property
    def direction(self) -> Literal["minimize", "maximize"]:
        """Optuna's word for it."""
        return "maximize" if self.higher_is_better else "minimize"

    @property
    def sign(self) -> int:
        """+1 where lower is better, -1 where higher is: `sign * value` is smaller for the better one."""
        return -1 if self.higher_is_better else 1

    @property
    def label(self) -> str:
        """An axis label: 'perplexity on wiki (lower is better)'."""
        kind = self.kind.label + (f" ({self.kind.unit})" if self.kind.unit else "")
        which = "higher" if self.higher_is_better else "lower"
        return f"{kind}{f' on {self.of}' if self.of else ''} ({which} is better)"

    def valid(self, value: object) -> bool:
        """A finite number in the kind's range (a perplexity <= 1, an accuracy above 1 are not measurements)."""
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        low_ok = value >= self.kind.low if self.kind.low_inclusive else value > self.kind.low
        return low_ok and value <= self.kind.high

    def invalid_reason(self, value: object) -> str:
        """Why `value` is not a measurement of this metric ('' when it is)."""
        if self.valid(value):
            return ""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{self.name}={value!r} is not a number"
        if not math.isfinite(value):
            return f"{self.name}={value} is not a finite number"
        bound = "[" if self.kind.low_inclusive else "("
        high = "inf)" if math.isinf(self.kind.high) else f"{self.kind.high:g}]"
        return f"{self.name}={value:g} is outside the {self.kind.label} range {bound}{self.kind.low:g}, {high}"

    def scaled(self, value: float) -> float:
        """The value on the scale decisions test on, oriented so that lower is better: sign x log(value) for a
        kind whose noise scales with its level, else sign x value."""
        return self.sign * (math.log(value) if self.kind.log_scale else value)


def metric(name: str) -> Metric | None:
    """The record of a metric by its name, or None for a name that is no metric (rho, step, a config key)."""
    for kind in KINDS:
        if not kind.per_set and name == kind.name:
            return Metric(name, kind, "")
        if kind.per_set and name.startswith(f"{kind.name}_") and len(name) > len(kind.name) + 1:
            return Metric(name, kind, name.removeprefix(f"{kind.name}_"))
    if name.startswith(f"{BENCH}_"):
        rest = name.removeprefix(f"{BENCH}_")
        for measure in sorted(BENCH_MEASURES, key=len, reverse=True):  # acc_norm before acc
            if rest.endswith(f"_{measure}") and len(rest) > len(measure) + 1:
                return Metric(name, BENCH_MEASURES[measure], rest.removesuffix(f"_{measure}"))
    return None


def require(name: str) -> Metric:
    """`metric(name)`, or a ValueError saying what a metric is."""
    found = metric(name)
    if found is None:
        raise ValueError(require_error(name))
    return found


def require_error(name: str) -> str:
    """Why `name` is no metric whose direction is known, in one line."""
    per_set = ", ".join(f"{k.name}_<set>" for k in KINDS if k.per_set)
    return (
        f"{name} is not a metric whose direction is known (metrics: {per_set}, {', '.join(run_wide_names())}, or "
        f"{BENCH}_<task>_<measure> with measure {', '.join(BENCH_MEASURES)}; add a kind in cart_sweeps/metric.py)"
    )


def per_set_names(val_sets: Sequence[str]) -> list[str]:
    """Every per-set metric a run on validation sets `val_sets` reports (what sweep.metric may name among them)."""
    return [f"{kind.name}_{name}" for kind in KINDS if kind.per_set for name in val_sets]


def run_wide_names() -> list[str]:
    """The metrics a run reports once, not per validation set (tokens_per_s)."""
    return [kind.name for kind in KINDS if not kind.per_set]


def is_metric(key: str) -> bool:
    """A measured number a summary keeps among its metrics: a per-set one, or any benchmark score."""
    found = metric(key)
    return (found is not None and found.kind.per_set) or key.startswith(f"{BENCH}_")


def seed_spreads(measured: Iterable[tuple[Hashable, float]]) -> list[float]:
    """How far one configuration's seeds spread, (max - min) / median, for each configuration of `measured`
    ((configuration, value) pairs) with two or more values: the noise plan and the analysis say a throughput
    measured beside other runs carries."""
    by_config: dict[Hashable, list[float]] = {}
    for config, value in measured:
        by_config.setdefault(config, []).append(value)
    return [(max(v) - min(v)) / median(v) for v in by_config.values() if len(v) > 1]
