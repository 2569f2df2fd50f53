"""The statistics a decision rests on, one place for the analysis and the sweep (docs/statistics.md). What a
decision cannot know it does not decide: a spread no larger than rounding makes is no noise, and a value not
finite or out of the metric's range is no measurement."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from cart_sweeps.metric import Metric

ALPHA = 0.05
# The seed s.d. of log-perplexity assumed where no seeds measure it (a one-seed screen; the simulator's truths):
# the paper publishes no seed spread, and 0.5% is the smaller of the two the project's tests bracket it with
PRIOR_SD = 0.005
POWER = 0.8  # what `plan` sizes the seeds per cell for
MOST_SEEDS = 1000  # past this, `seeds_for_power` says the margin is out of reach


@dataclass(frozen=True)
class Noise:
    """Seed noise on the tested scale: a pooled s.d., its degrees of freedom, where, and the values' resolution."""

    sd: float
    df: float  # inf: a stated s.d. (PRIOR_SD), not measured
    source: str
    resolution: float = 0.0

    @property
    def measurable(self) -> bool:
        """Whether the spread is more than rounding to the values' step could make alone: seeds that differ by
        at most one step have an s.d. of at most step / sqrt(2) (two seeds one step apart)."""
        return self.sd > self.resolution / math.sqrt(2)


@dataclass(frozen=True)
class Option:
    """One option's runs: the mean (shown), its rank value (lower first), and the tested scale's mean and var."""

    level: Any
    mean: float
    rank: float
    score_mean: float
    score_var: float  # NaN for one seed
    seeds: int
    resolution: float = 0.0  # of the values compared, on the tested scale (`resolution`)


@dataclass(frozen=True)
class Verdict:
    """A best-of-k decision as the sweep acts on it: the choice, whether it is decided, what it is tied with."""

    choice: Any
    decided: bool
    options: list[Option]  # best first
    noise: Noise | None
    tied: list[Any] = field(default_factory=list)
    p_value: float | None = None  # the largest Holm-adjusted p (decided iff <= the look's alpha)
    equivalent: list[Any] = field(default_factory=list)  # options decided within the margin of the choice

    @property
    def best(self) -> bool:
        """Decided on one best: every other option beaten, none only equivalent."""
        return self.decided and not self.equivalent


DIGITS = 9  # values written to more significant digits than this count as measured to full precision


def quantum(values: Sequence[float]) -> float:
    """The step the values are written to: the coarsest power of ten they are all whole multiples of (0.001 for
    41.165 and 41.215), or 0 for values with more than DIGITS significant digits (measured, not rounded)."""
    finite = [abs(v) for v in values if math.isfinite(v) and v != 0]
    if not finite:
        return 0.0
    top = max(finite)
    for exponent in range(math.floor(math.log10(top)), math.floor(math.log10(top)) - DIGITS, -1):
        step = 10.0**exponent
        if all(abs(v / step - round(v / step)) < 1e-6 for v in finite):
            return step
    return 0.0


def resolution(values: Sequence[float], metric: Metric) -> float:
    """How far apart two of these values must be on the tested scale to be told apart: the step they are written
    to (relative to the smallest, on a log scale), and at least the metric's own resolution."""
    step, finite = quantum(values), [abs(v) for v in values if math.isfinite(v) and v != 0]
    if step and metric.kind.log_scale and finite:
        step /= min(finite)
    return max(step, metric.kind.resolution)


def option(level: Any, values: Sequence[float], metric: Metric, at: float | None = None) -> Option:
    """An option from its seeds' valid values; `at`: the whole comparison's resolution (default: its own)."""
    scores = np.array([metric.scaled(v) for v in values])
    var = float(scores.var(ddof=1)) if len(scores) > 1 else math.nan
    mean = float(np.mean(values))
    step = resolution(values, metric) if at is None else at
    return Option(level, mean, metric.sign * mean, float(scores.mean()), var, len(scores), step)


def pool(opts: Sequence[Option], source: str) -> Noise | None:
    """The seed s.d. on the tested scale, pooled over the options that have several seeds; None where none has."""
    df = sum(o.seeds - 1 for o in opts)
    if df == 0:
        return None
    sd = math.sqrt(sum((o.seeds - 1) * o.score_var for o in opts if o.seeds > 1) / df)
    return Noise(sd, df, source, max(o.resolution for o in opts))


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: reject where <= alpha controls the family's error at alpha."""
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


def gap(better: Option, worse: Option, noise: Noise) -> tuple[float, float]:
    """(difference worse - better on the tested scale, its standard error) under the pooled noise."""
    return worse.score_mean - better.score_mean, noise.sd * math.sqrt(1 / better.seeds + 1 / worse.seeds)


def p_better(better: Option, worse: Option, noise: Noise, allowance: float = 0.0) -> float:
    """One-sided p that `better` is better on the tested scale (a direction fixed before the data) by more than
    `allowance`; 1 (no evidence) where the noise is not measurable: callers say so before they test."""
    diff, se = gap(better, worse, noise)
    if not noise.measurable or se <= 0:
        return 1.0
    # Student's t survival function, the ufunc that scipy.stats.t.sf calls (the same values) without its argument
    # checks, ~50x its speed: the simulator calls this millions of times. 2 s to import scipy: not at driver start.
    from scipy.special import stdtr

    return float(stdtr(noise.df, -(diff - allowance) / se))


def critical(noise: Noise, level: float) -> float:
    """The gap, in standard errors, that `two_sided`'s p reaches `level` at: what a stated threshold quotes."""
    from scipy.special import stdtrit  # see p_better

    return float(stdtrit(noise.df, 1 - level / 2))


def two_sided(opts: Sequence[Option], noise: Noise, allowance: float = 0.0) -> np.ndarray:
    """The two-sided p of the choice (opts[0]) against each other option, in their order, before Holm: the one-
    sided p doubled, since the data chose which option is on top."""
    return np.array([min(1.0, 2 * p_better(opts[0], o, noise, allowance)) for o in opts[1:]])


def tested_margin(equivalence: float, metric: Metric, best: Option) -> float:
    """A relative margin on the tested scale: itself on a log scale (a ratio), else that share of the best's mean."""
    return equivalence if metric.kind.log_scale else equivalence * abs(best.mean)


def p_within(better: Option, worse: Option, noise: Noise, margin: float) -> float:
    """Schuirmann's two one-sided tests: the p that the two differ on the tested scale by less than `margin`
    either way (the larger of the two one-sided p); 1 where the noise is not measurable or no margin is left."""
    diff, se = gap(better, worse, noise)
    if not noise.measurable or se <= 0 or margin <= 0:
        return 1.0
    from scipy.special import stdtr  # see p_better

    return float(max(stdtr(noise.df, -(diff + margin) / se), stdtr(noise.df, (diff - margin) / se)))


@dataclass(frozen=True)
class Settled:
    """Per other option, in order: the Holm-adjusted p of its claim, and whether it is "within" (else "worse")."""

    adjusted: np.ndarray
    within: np.ndarray


def settle(opts: Sequence[Option], noise: Noise, allowance: float = 0.0, margin: float | None = None) -> Settled:
    """Per other option, its claim: worse than the choice by more than `allowance`, or with a margin within
    `margin - allowance` of it. Both claims of every pair are one Holm family (2 (k - 1) tests): Holm over the
    pairs alone is false above alpha on a three-way tie (docs/floor.py). Each pair says its smaller-p claim."""
    worse = two_sided(opts, noise, allowance)
    if margin is None or margin <= allowance:  # no room inside the margin: equivalence is not tested at all
        return Settled(holm(worse), np.zeros(len(worse), dtype=bool))
    within = np.array([p_within(opts[0], o, noise, margin - allowance) for o in opts[1:]])
    both = holm(np.concatenate([worse, within]))
    adj_worse, adj_within = both[: len(worse)], both[len(worse) :]
    said_within = adj_within < adj_worse
    return Settled(np.minimum(adj_worse, adj_within), said_within)


def options(values: Mapping[Any, Sequence[float]], metric: Metric) -> list[Option]:
    """The valid options, best first, at the resolution of all their values."""
    at = resolution([x for v in values.values() for x in v], metric)
    valid = {c: v for c, v in values.items() if all(metric.valid(x) for x in v)}
    return sorted((option(c, v, metric, at) for c, v in valid.items()), key=lambda o: o.rank)


def best_level(
    values: Mapping[Any, Sequence[float]],
    metric: Metric,
    alpha: float = ALPHA,
    looks: int = 1,
    equivalence: float | None = None,
    level: float | None = None,
) -> Verdict:
    """The best-of-k decision over each option's seed values, at alpha / looks (or a look's spent `level`): a
    `stage.max_seeds` round's and the analysis's; with `equivalence` an option may be equivalent instead of worse.
    One option, no measurable spread, or a value that is no measurement decides nothing."""
    opts = options(values, metric)
    noise = pool(opts, "the options' seeds")
    if len(opts) < 2 or len(opts) < len(values) or noise is None or not noise.measurable:
        return Verdict(opts[0].level if opts else None, False, opts, noise, [o.level for o in opts[1:]])
    margin = None if equivalence is None else tested_margin(equivalence, metric, opts[0])
    found = settle(opts, noise, margin=margin)
    at = alpha / looks if level is None else level
    tied = [o.level for o, a in zip(opts[1:], found.adjusted, strict=True) if a > at]
    within = [o.level for o, a, w in zip(opts[1:], found.adjusted, found.within, strict=True) if a <= at and w]
    return Verdict(opts[0].level, not tied, opts, noise, tied, float(found.adjusted.max()), within)


def looks(grid_seeds: int, max_seeds: int | None) -> int:
    """How often a stage adding a seed per round up to `max_seeds` decides: after the grid, and each seed."""
    return 1 if max_seeds is None else max(1, max_seeds - grid_seeds + 1)


def spent(alpha: float, t: float) -> float:
    """The alpha spent by information time t in (0, 1] (Lan & DeMets 1983, O'Brien-Fleming-like): 2 - 2 Phi(
    z_{1 - alpha / 2} / sqrt(t)); little early, most at the last look, alpha at t = 1."""
    from scipy import stats  # see p_better

    return float(2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(t)))


def look_level(alpha: float, look: int, looks: int) -> float:
    """The level of look `look` (from 1) of `looks`: the alpha spent since the one before. The levels sum to
    alpha, so a false decision at any look stays under it (a union bound: conservative)."""
    if looks <= 1:
        return alpha
    return spent(alpha, look / looks) - (spent(alpha, (look - 1) / looks) if look > 1 else 0.0)


def power(seeds: int, margin: float, sd: float, alpha: float, k: int) -> float:
    """The chance that `seeds` per option decide a true `margin` between the best of `k` and its runner-up: a
    two-sided t at Holm's strictest step, alpha / (k - 1), on the pooled noise (conservative)."""
    df = k * (seeds - 1)
    if df < 1 or sd <= 0:
        return 0.0
    level = alpha / max(1, k - 1)
    from scipy import stats  # see p_better

    crit = float(stats.t.ppf(1 - level / 2, df))
    shift = abs(margin) / (sd * math.sqrt(2 / seeds))
    return float(stats.nct.sf(crit, df, shift) + stats.nct.cdf(-crit, df, shift))


def seeds_for_power(margin: float, sd: float, alpha: float, k: int, target: float = POWER) -> int | None:
    """The fewest seeds per option that decide `margin` with chance `target` (`power`); None: none up to MOST_SEEDS."""
    if margin == 0 or sd <= 0:
        return None if margin == 0 else 2
    low, high = 2, MOST_SEEDS
    if power(high, margin, sd, alpha, k) < target:
        return None
    while low < high:  # power grows with the seeds: bisect for the first that reaches the target
        mid = (low + high) // 2
        low, high = (mid + 1, high) if power(mid, margin, sd, alpha, k) < target else (low, mid)
    return low


@dataclass(frozen=True)
class Ranked:
    """One option of a "best" by seed mean: its mean `metric` over its seeds, and how many seeds."""

    option: Any
    mean: float
    seeds: int


def seed_mean(values: Sequence[float]) -> float:
    """The mean of an option's seeds, the same whatever order its seeds come in (sorted, exact sum)."""
    return math.fsum(sorted(values)) / len(values)


def ranked(values: Mapping[Any, Sequence[float]], metric: Metric) -> list[Ranked]:
    """The options best first by seed mean in the metric's direction: the one "best" of zoom, the tables and the
    benchmarks stage. Exactly equal means keep the options' own order (the smallest R, then P, first); a value
    not finite is no measurement, and an option without one no candidate."""
    finite = {option: [x for x in v if math.isfinite(x)] for option, v in values.items()}
    means = [Ranked(option, seed_mean(v), len(v)) for option, v in finite.items() if v]
    return sorted(means, key=lambda r: (metric.sign * r.mean, _order(r.option)))


@dataclass(frozen=True)
class Best:
    """The best option by `ranked`, and those whose mean equals its exactly (said tied rather than a pick)."""

    choice: Any
    mean: float
    seeds: int
    tied: tuple[Any, ...] = ()


def best(values: Mapping[Any, Sequence[float]], metric: Metric) -> Best | None:
    """The first of `ranked`, with its ties; None where no option has a value."""
    order = ranked(values, metric)
    if not order:
        return None
    top = order[0]
    tied = tuple(r.option for r in order[1:] if r.mean == top.mean)
    return Best(top.option, top.mean, top.seeds, tied)


def best_per(rows: Iterable[tuple[Any, Any, float]], metric: Metric) -> dict[Any, Best]:
    """Per group (a width), ascending, the best by `ranked` from (group, option, value) rows, one per run."""
    grouped: dict[Any, dict[Any, list[float]]] = {}
    for group, option, value in rows:
        grouped.setdefault(group, {}).setdefault(option, []).append(value)
    out: dict[Any, Best] = {}
    for group in sorted(grouped, key=_order):
        if (found := best(grouped[group], metric)) is not None:
            out[group] = found
    return out


def _order(option: Any) -> tuple[Any, ...]:
    """The options' own order: numbers as numbers, anything else by its text (a mix stays comparable)."""
    if isinstance(option, tuple):  # a configuration: ((key, value), ...) or (R, P), part by part
        return tuple(_order(part) for part in option)
    return (0, option, "") if isinstance(option, Real) and not isinstance(option, bool) else (1, 0, str(option))


# The seeds a stage adds, in order (rules/seeds.py, a ladder): its own first, then these.
SEEDS = (42, 137, 271, 314, 577, 618, 828, 1123, 1414, 1732, 2236, 2718, 3141, 4669, 6022, 8128)


def seed_order(first: Sequence[int]) -> list[int]:
    """The seeds in the order a stage adds them: its own, then SEEDS."""
    return [*first, *(s for s in SEEDS if s not in first)]


def seeds_in_every(order: Sequence[int], cells: Sequence[Mapping[int, float]]) -> int:
    """How many of `order`'s first seeds every cell has a result for."""
    n = 0
    while n < len(order) and all(order[n] in c for c in cells):
        n += 1
    return n
