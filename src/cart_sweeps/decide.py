"""The statistics a decision rests on, in one place for the analysis (which words its findings) and the
sweep (which adds seeds where a decision is open): no torch, no Optuna, no analysis imports.

Options are compared on log-metric (seed noise on a perplexity scales with its level, and a difference of
logs is a ratio), lower is better, with one pooled seed s.d. A best-of-k choice is decided when it beats
every other option, each by a two-sided t-test, Holm's step-down over the k - 1 comparisons. A stage that
adds seeds while a decision is open looks at its data several times: each look tests at alpha / looks
(Bonferroni over the looks), so the whole sequence, whatever it stops on, is wrong at most at alpha.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALPHA = 0.05
POWER = 0.8  # what `plan` sizes the seeds per cell for
MOST_SEEDS = 1000  # past this, `seeds_for_power` says the margin is out of reach


@dataclass(frozen=True)
class Noise:
    """Seed noise of the log-metric: a pooled s.d., its degrees of freedom, and where it was measured."""

    sd: float
    df: int
    source: str


@dataclass(frozen=True)
class Option:
    """One option's runs: the mean metric (what the tables rank by), the mean log-metric (what is tested)."""

    level: Any
    mean: float
    log_mean: float
    log_var: float  # NaN for one seed
    seeds: int


@dataclass(frozen=True)
class Verdict:
    """A best-of-k decision as the sweep acts on it: the choice, whether it is decided, what it is tied with."""

    choice: Any
    decided: bool
    options: list[Option]  # best first
    noise: Noise | None
    tied: list[Any] = field(default_factory=list)
    p_value: float | None = None  # the largest Holm-adjusted p (decided iff <= the look's alpha)


def option(level: Any, values: Sequence[float]) -> Option:
    """An option from its seeds' metric values."""
    logs = np.log(np.asarray(values, dtype=float))
    var = float(logs.var(ddof=1)) if len(logs) > 1 else math.nan
    return Option(level, float(np.mean(values)), float(logs.mean()), var, len(logs))


def pool(opts: Sequence[Option], source: str) -> Noise | None:
    """The seed s.d. of log-metric pooled over the options that have several seeds; None where none has."""
    df = sum(o.seeds - 1 for o in opts)
    if df == 0:
        return None
    return Noise(math.sqrt(sum((o.seeds - 1) * o.log_var for o in opts if o.seeds > 1) / df), df, source)


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: reject where <= alpha controls the family's error at alpha."""
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


def gap(better: Option, worse: Option, noise: Noise) -> tuple[float, float]:
    """(log difference worse - better, its standard error) under the pooled noise."""
    return worse.log_mean - better.log_mean, noise.sd * math.sqrt(1 / better.seeds + 1 / worse.seeds)


def p_better(better: Option, worse: Option, noise: Noise) -> float:
    """One-sided p that `better` has the lower mean log-metric (a direction fixed before the data)."""
    diff, se = gap(better, worse, noise)
    from scipy import stats  # 2 s to import: only where a decision is computed, not in every driver start

    return float(stats.t.sf(diff / se, noise.df)) if se > 0 else float(diff <= 0)


def against_others(opts: Sequence[Option], noise: Noise) -> np.ndarray:
    """The Holm-adjusted two-sided p of the choice (opts[0]) against each other option, in their order.
    Two-sided (the one-sided p doubled): the data chose which option is on top."""
    p = np.array([min(1.0, 2 * p_better(opts[0], o, noise)) for o in opts[1:]])
    return holm(p)


def best_level(values: Mapping[Any, Sequence[float]], alpha: float = ALPHA, looks: int = 1) -> Verdict:
    """The best-of-k decision over each option's seed values (lower is better), at alpha / looks: what a
    stage with `stage.max_seeds` decides after each round, and what the analysis says of its final data.
    One option, or no seed spread, decides nothing."""
    opts = sorted((option(level, v) for level, v in values.items()), key=lambda o: o.mean)
    noise = pool(opts, "the options' seeds")
    if len(opts) < 2 or noise is None:
        return Verdict(opts[0].level if opts else None, False, opts, noise, [o.level for o in opts[1:]])
    adjusted = against_others(opts, noise)
    tied = [o.level for o, a in zip(opts[1:], adjusted, strict=True) if a > alpha / looks]
    return Verdict(opts[0].level, not tied, opts, noise, tied, float(adjusted.max()))


def looks(grid_seeds: int, max_seeds: int | None) -> int:
    """How often a stage adding one seed per round until `max_seeds` may decide: after its grid's seeds,
    and after each added seed."""
    return 1 if max_seeds is None else max(1, max_seeds - grid_seeds + 1)


def power(seeds: int, margin: float, sd: float, alpha: float, k: int) -> float:
    """The chance that `seeds` seeds per option decide a true log margin `margin` between the best of `k`
    options and its runner-up: a two-sided t-test at Holm's strictest step, alpha / (k - 1), on the noise
    pooled over the k options (conservative: Holm's later steps are less strict)."""
    df = k * (seeds - 1)
    if df < 1 or sd <= 0:
        return 0.0
    level = alpha / max(1, k - 1)
    from scipy import stats  # see p_better

    crit = float(stats.t.ppf(1 - level / 2, df))
    shift = abs(margin) / (sd * math.sqrt(2 / seeds))
    return float(stats.nct.sf(crit, df, shift) + stats.nct.cdf(-crit, df, shift))


def seeds_for_power(margin: float, sd: float, alpha: float, k: int, target: float = POWER) -> int | None:
    """The fewest seeds per option that decide a true log margin `margin` with chance `target` (see `power`);
    None when no seed count up to MOST_SEEDS does (a margin of zero never is decided)."""
    if margin == 0 or sd <= 0:
        return None if margin == 0 else 2
    low, high = 2, MOST_SEEDS
    if power(high, margin, sd, alpha, k) < target:
        return None
    while low < high:  # power grows with the seeds: bisect for the first that reaches the target
        mid = (low + high) // 2
        low, high = (mid + 1, high) if power(mid, margin, sd, alpha, k) < target else (low, mid)
    return low
