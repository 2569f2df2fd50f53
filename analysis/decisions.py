"""How sure each finding is: one record per claim the report makes in words, decided only where the seeds
tell the choice from every other option at the error rate alpha, multiple comparisons included. The test is
docs/statistics.md's; its statistics live in cart_sweeps.rules.decide (the sweep adds seeds by the same test).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from cart_sweeps.metric import require
from cart_sweeps.rules.decide import (
    ALPHA,
    Noise,
    Option,
    gap,
    look_level,
    pool,
    resolution,
    settle,
    tested_margin,
    two_sided,
)

from . import tables

SHORT = {**tables.SHORT, "eval_n_loops": "R", "R": "R"}  # an inference R is an R too
NO_SPREAD = "no seed spread"
NO_MEASURABLE = "no measurable seed spread"
SIDES = {"cart": "CART", "dense": "dense"}  # a parity claim's options, as written
VERDICTS = ("reversal", "p_ordering", "ablation", "parity")  # claims whose choice is a verdict word, not an option


def unmeasured(noise: Noise | None) -> str | None:
    """Why this noise cannot decide anything (no spread, or none measurable), or None where it can."""
    if noise is None:
        return NO_SPREAD
    return None if noise.measurable else NO_MEASURABLE


@dataclass(frozen=True)
class Margin:
    """How far `over` lies from the choice, in % of the choice's metric, with its (1 - alpha) interval."""

    over: Any
    pct: float
    ci_pct: tuple[float, float]


@dataclass(frozen=True)
class Comparison(Margin):
    """The choice against one other option: the margin, its two-sided p, and that p after Holm over the claim's
    comparisons (the choice beats `over` at alpha where p_adjusted <= alpha)."""

    p: float
    p_adjusted: float


@dataclass(frozen=True)
class Decision:
    """One claim: the choice the data point to, whether it is decided at alpha, and what it rests on."""

    claim: str  # best_R, best, reversal, p_ordering, ablation, parity, trained_R_best
    stage: str
    cell: dict[str, Any]  # what the claim is about beside its options, e.g. {"d_model": 256, "n_prelude": 6}
    axis: str  # the column whose levels are the options
    choice: Any
    decided: bool
    why: str
    tied: list[Any] = field(default_factory=list)  # options the data cannot tell from the choice
    margin: Margin | None = None  # the runner-up's
    comparisons: list[Comparison] = field(default_factory=list)  # the choice against each other option, in rank
    p_value: float | None = None  # the largest Holm-adjusted p of the comparisons the claim needs
    method: str = ""
    seeds: dict[str, int] = field(default_factory=dict)  # seeds behind each option
    means: dict[str, float] = field(default_factory=dict)  # each option's mean metric
    noise: Noise | None = None  # the seed noise the tests used
    alpha: float = ALPHA
    role: str | None = None  # the part of the paper's study the stage plays (screen, confirm, ...)
    no_level: int = 0  # the cell's runs with no value of the axis (a dense run's R): no option, left out
    equivalence: float | None = None  # the relative margin the claim was tested with (None: none)
    equivalent: list[Any] = field(default_factory=list)  # options decided within the margin of the choice
    metric: str = ""  # what the options were compared on (its direction words the gaps)

    @property
    def d(self) -> Any:
        return self.cell.get("d_model")

    def as_json(self) -> dict[str, Any]:
        """The record as findings.json holds it: a verdict word (VERDICTS) is its `choice` only where decided, else
        None with `leaning` saying where the estimates lean, so no reader takes it for a finding."""
        out = {"claim": self.claim, "stage": self.stage, "d": plain(self.d), **asdict(self)}
        out["cell"] = {k: plain(v) for k, v in self.cell.items()}
        out["choice"], out["tied"] = plain(self.choice), [plain(t) for t in self.tied]
        out["equivalent"] = [plain(t) for t in self.equivalent]
        out["leaning"] = out["choice"]
        if self.claim in VERDICTS and not self.decided:
            out["choice"] = None
        if self.margin:
            out["margin"] = {**out["margin"], "over": plain(self.margin.over), "ci_pct": list(self.margin.ci_pct)}
        out["comparisons"] = [{**asdict(c), "over": plain(c.over), "ci_pct": list(c.ci_pct)} for c in self.comparisons]
        return out


def plain(value: Any) -> Any:
    """A JSON-safe Python scalar: numpy/pandas numbers to int/float/bool, missing to None."""
    if value is None or value is pd.NA or (isinstance(value, float | np.floating) and math.isnan(value)):
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    return float(value) if isinstance(value, float | np.floating) else value


def label(axis: str, level: Any) -> str:
    """An option as the report writes it: R=8, P=6, dense."""
    return f"{SHORT[axis]}={plain(level)}" if axis in SHORT else str(level)


def and_(items: list[str], word: str = "and") -> str:
    """'a', 'a and b', 'a, b and c' (or with `word`: 'a, b or c')."""
    return f" {word} ".join([", ".join(items[:-1]), items[-1]] if len(items) > 2 else items)


def cell_key(values: Any) -> tuple:
    """A cell's values as a key: missing (NaN, NA) as None, so two cells both missing a value are one cell."""
    return tuple(None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v for v in values)


def where(stage: str, cell: dict[str, Any]) -> str:
    """'Stage 2, d=768 P=6': the claim's place."""
    at = " ".join(label(k, v) for k, v in cell.items() if k in SHORT)
    return f"Stage {stage}" + (f", {at}" if at else "")


def leveled(rows: pd.DataFrame, axis: str) -> pd.DataFrame:
    """The rows holding a value of `axis`: a run without one (a dense run's R, a blank in a CSV) is no option."""
    return rows[rows[axis].notna()]


def _observations(rows: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows holding a valid value of metric `name`, each run once."""
    record = require(name)
    rows = rows[rows[name].map(record.valid)]
    return rows.drop_duplicates("run_id") if "run_id" in rows else rows


def grouped_options(rows: pd.DataFrame, metric: str, axis: str, cell: list[str]) -> dict[tuple, list[Option]]:
    """Every cell's options (one groupby for the whole frame), best (as the tables rank, in the metric's
    direction) first; rows without a valid value of the metric or a value of the axis are left out, and each run
    counts once."""
    record = require(metric)
    rows = _observations(leveled(rows, axis), metric)
    values = rows[metric].astype(float)
    scores = record.sign * (np.log(values) if record.kind.log_scale else values)
    frame = pd.DataFrame({"v": values, "score": scores})
    groups = frame.groupby([rows[c] for c in [*cell, axis]], dropna=False, sort=True)
    stats_ = pd.concat(
        {"mean": groups["v"].mean(), "score_mean": groups["score"].mean(), "score_var": groups["score"].var(ddof=1)},
        axis=1,
    ).assign(seeds=groups["v"].count())
    index = stats_.index.to_frame(index=False)
    keys = [cell_key(k) for k in zip(*(index[c].tolist() for c in cell), strict=True)] if cell else [()] * len(index)
    columns = (stats_[c].tolist() for c in ("mean", "score_mean", "score_var", "seeds"))
    at = resolution(values.tolist(), record)  # the input's precision: one for every option compared
    out: dict[tuple, list[Option]] = {}
    for key, level, mean, score, var, seeds in zip(keys, index[axis].tolist(), *columns, strict=True):
        out.setdefault(key, []).append(Option(level, mean, record.sign * mean, score, var, seeds, at))
    return {key: sorted(opts, key=lambda o: o.rank) for key, opts in out.items()}


def absent(rows: pd.DataFrame, metric: str, axis: str, cell: list[str]) -> dict[tuple, list[Any]]:
    """Per cell, the options whose rows hold no valid value of the metric (they would vanish from its claim)."""
    rows = leveled(rows, axis)
    valid = _observations(rows, metric)
    seen = {cell_key(r) for r in rows[[*cell, axis]].drop_duplicates().itertuples(index=False)}
    held = {cell_key(r) for r in valid[[*cell, axis]].drop_duplicates().itertuples(index=False)}
    out: dict[tuple, list[Any]] = {}
    for *key, level in sorted(seen - held, key=str):
        out.setdefault(tuple(key), []).append(level)
    return out


def options(rows: pd.DataFrame, metric: str, axis: str) -> list[Option]:
    """The options of one claim, best first."""
    return grouped_options(rows, metric, axis, []).get((), [])


def pooled_noise(rows: pd.DataFrame, metric: str, cell: list[str], source: str) -> Noise | None:
    """`pool` over every configuration (the values of `cell`) of `rows`."""
    groups = grouped_options(rows, metric, cell[-1], cell[:-1])
    return pool([o for opts in groups.values() for o in opts], source)


def margin(better: Option, worse: Option, noise: Noise, alpha: float, metric: str) -> Margin:
    """How much worse `worse` is than `better`, in % of `better`'s metric, with a two-sided (1 - alpha) t
    interval: a ratio on a log scale, a difference over the better mean on a linear one. (The tested scale is
    sign x log: where higher is better, `better` over `worse` is exp(diff), so worse/better - 1 is -expm1(-diff).)"""
    diff, se = gap(better, worse, noise)
    half = float(stats.t.ppf(1 - alpha / 2, noise.df)) * se
    points = (diff, diff - half, diff + half)
    record = require(metric)
    if record.kind.log_scale:
        pct = [100 * record.sign * math.expm1(record.sign * x) for x in points]
    else:
        pct = [100 * x / abs(better.mean) if better.mean else math.nan for x in points]
    return Margin(worse.level, round(pct[0], 6), (round(pct[1], 6), round(pct[2], 6)))


def differs(pct: float, metric: str) -> str:
    """'0.49% higher': how far the worse option lies from the better one, in the metric's direction (a throughput's
    worse option is lower), so a sentence naming two options cannot be read backwards."""
    return f"{pct:.2f}% {'lower' if require(metric).higher_is_better else 'higher'}"


def worse_by(pct: float, ci: tuple[float, float] | list[float], alpha: float, p: float | None) -> str:
    """'1.90% worse (95% CI 1.40 to 2.40), p=2e-05': a decided margin as every sentence says it."""
    return f"{pct:.2f}% worse ({round(100 * (1 - alpha))}% CI {ci[0]:.2f} to {ci[1]:.2f}), p={p:.2g}"


def look_alpha(rows: pd.DataFrame, alpha: float) -> Callable[[list[Option]], float]:
    """The error rate a claim was decided at, from its options: for a stage that added seeds while undecided
    (`looks`, `grid_seeds`), the alpha the driver spent at the look its seeds end on (rules.decide.look_level),
    so the analysis says what the driver decided; alpha / looks where only `looks` is known (a CSV, a ladder)."""
    looks = int(rows["looks"].max()) if "looks" in rows and rows["looks"].notna().any() else 1
    known = "grid_seeds" in rows and rows["grid_seeds"].notna().any()
    first = int(rows["grid_seeds"].max()) if known else None

    def at(opts: list[Option]) -> float:
        if looks == 1:
            return alpha
        if first is None or not opts:
            return alpha / looks
        return look_level(alpha, min(looks, max(1, min(o.seeds for o in opts) - first + 1)), looks)

    return at


def equivalence_of(rows: pd.DataFrame) -> float | None:
    """The relative margin a stage's claims are tested with: its stage.equivalence, or the analysis's
    --equivalence (the `equivalence` column), None for none."""
    if "equivalence" not in rows or not rows["equivalence"].notna().any():
        return None
    return float(rows["equivalence"].max())


def seeds_text(counts: list[int]) -> str:
    """'3 seeds each' or '3/3/1 seeds' (each option's seeds, in rank)."""
    if len(set(counts)) == 1:
        return f"{counts[0]} seed{'s' * (counts[0] > 1)} each"
    return f"{'/'.join(map(str, counts))} seeds"


def method_text(noise: Noise, what: str) -> str:
    return f"{what}; pooled t on the metric's tested scale, seed s.d. {noise.sd:.3g} ({noise.df} df, {noise.source})"


def best(
    rows: pd.DataFrame,
    metric: str,
    axis: str,
    cell: list[str],
    *,
    stage: str,
    claim: str = "best",
    alpha: float = ALPHA,
    noise: Noise | None = None,
) -> list[Decision]:
    """One best-of-k decision per cell of `rows` (`axis`: the options; `cell`: what else defines a claim), decided
    where the best mean beats every other option at alpha, two-sided (the data chose which is on top), Holm over
    the k - 1. `noise` only where no cell has several seeds; runs without a value of `axis` are counted, no option."""
    groups, gone = grouped_options(rows, metric, axis, cell), absent(rows, metric, axis, cell)
    level = look_alpha(rows, alpha)
    whole = equivalence_of(rows)
    margins = {cell_key(at): equivalence_of(part) for at, part in rows.groupby(cell, dropna=False)} if cell else {}
    stage_noise = pool([o for opts in groups.values() for o in opts], f"the seeds of stage {stage}") or noise
    counts = Counter(cell_key(r) for r in rows.loc[rows[axis].isna(), cell].itertuples(index=False))
    out = []
    for at in [*groups, *(k for k in counts if k not in groups)]:
        where = dict(zip(cell, at, strict=True))
        if at not in groups:
            why = f"its {runs(counts[at])} no {SHORT.get(axis, axis)}: nothing to compare"
            out.append(
                Decision(
                    claim, stage, where, axis, None, False, why, alpha=level([]), no_level=counts[at], metric=metric
                )
            )
            continue
        own = pool(groups[at], "the options' seeds") or stage_noise
        margin = margins.get(at, whole)  # none at a rung a ladder promoted from (load._settled_steps)
        made = best_of(groups[at], own, claim, stage, where, axis, level(groups[at]), metric, gone.get(at, []), margin)
        if at in counts:
            why = f"{made.why}; {runs(counts[at])} no {SHORT.get(axis, axis)} (left out)"
            made = replace(made, why=why, no_level=counts[at])
        out.append(made)
    return out


def runs(n: int) -> str:
    """'1 run has', '3 runs have'."""
    return f"{n} run{'s have' if n != 1 else ' has'}"


def best_of(
    opts: list[Option],
    noise: Noise | None,
    claim: str,
    stage: str,
    cell: dict[str, Any],
    axis: str,
    alpha: float,
    metric: str,
    missing: list[Any] | tuple[Any, ...] = (),
    equivalence: float | None = None,
) -> Decision:
    """The best-of-k decision over `opts` (best first); see `best`. `missing` options leave it undecided;
    within `equivalence` an option may be decided equivalent instead of worse (rules/decide.settle)."""
    choice, others = opts[0], opts[1:]
    base = Decision(
        claim, stage, cell, axis, choice.level, False, "", alpha=alpha, equivalence=equivalence, metric=metric
    )
    base = replace(
        base,
        seeds={str(plain(o.level)): o.seeds for o in opts},
        means={str(plain(o.level)): round(o.mean, 6) for o in opts},
        noise=noise,
    )
    name = label(axis, choice.level)
    if missing:
        gone = and_([label(axis, m) for m in missing])
        why = f"{gone} {'has' if len(missing) == 1 else 'have'} no valid {metric} (left out), so the best is not told"
        return replace(base, tied=[o.level for o in others], why=why, method="none")
    if not others:
        return replace(base, why=f"{name} is the only option: nothing to compare")
    if noise is None:
        why = f"{NO_SPREAD}: one seed per option and no noise measured in the stage, so {name} is a point pick"
        return replace(base, tied=[o.level for o in others], why=why, method="none")
    if not noise.measurable:
        why = (
            f"{NO_MEASURABLE}: the seeds' s.d. {noise.sd:.3g} ({noise.source}) is no more than rounding to the "
            f"values' resolution {noise.resolution:.3g} makes, so {name} is a point pick"
        )
        return replace(base, tied=[o.level for o in others], why=why, method="none")
    raw = two_sided(opts, noise)
    found = settle(
        opts, noise, margin=None if equivalence is None else tested_margin(equivalence, require(metric), choice)
    )
    compared = [
        Comparison(**asdict(margin(choice, o, noise, alpha, metric)), p=float(p), p_adjusted=float(a))
        for o, p, a in zip(others, raw, found.adjusted, strict=True)
    ]
    runner = min(compared, key=lambda c: c.pct)
    tied = [c.over for c in compared if c.p_adjusted > alpha]
    equivalent = [c.over for c, w in zip(compared, found.within, strict=True) if w and c.p_adjusted <= alpha]
    decided = not tied
    if decided:
        why = decided_text(name, compared, equivalent, alpha, lambda level: label(axis, level), equivalence, metric)
    else:
        seeds = seeds_text([o.seeds for o in opts])
        why = not_told(name, compared, alpha, lambda level: label(axis, level), seeds, metric)
    return replace(
        base,
        decided=decided,
        tied=tied,
        why=why,
        margin=Margin(runner.over, runner.pct, runner.ci_pct),
        comparisons=compared,
        p_value=float(found.adjusted.max()),
        method=method_text(noise, f"{tests(equivalence)}, Holm over {len(others)} comparison{'s' * (len(others) > 1)}"),
        equivalent=equivalent,
    )


def tests(equivalence: float | None) -> str:
    """The tests a claim ran, as its method says them."""
    if equivalence is None:
        return "two-sided"
    return f"two-sided, or two one-sided tests of equivalence within {100 * equivalence:g}% (the smaller p per pair)"


def decided_text(
    name: str,
    compared: list[Comparison],
    equivalent: list[Any],
    alpha: float,
    named: Callable[[Any], str],
    equivalence: float | None,
    metric: str,
) -> str:
    """A decided best-of-k in words: 'R=6 beats R=2 at alpha=0.05 (Holm)', or with a margin 'R=6 and R=8 are
    equivalent within 1% (R=8 0.06% higher, adjusted p=0.01); R=6 beats R=2 at alpha=0.05 (Holm)'."""
    beaten = [named(c.over) for c in compared if c.over not in equivalent]
    beats = f"{name} beats {', '.join(beaten)} at alpha={alpha:.3g} (Holm)" if beaten else ""
    if not equivalent:
        return beats
    said = [
        f"{named(c.over)} {differs(c.pct, metric)}, adjusted p={c.p_adjusted:.2g}"
        for c in compared
        if c.over in equivalent
    ]
    both = and_([name, *(named(e) for e in equivalent)])
    same = f"{both} are equivalent within {100 * (equivalence or 0):g}% ({'; '.join(said)})"
    return f"{same}; {beats}" if beats else f"{same} at alpha={alpha:.3g} (Holm)"


def not_told(
    name: str, compared: list[Comparison], alpha: float, named: Callable[[Any], str], seeds: str, metric: str
) -> str:
    """An undecided best-of-k in words, the closest to decided first (a near-decision is said, not hidden behind
    the largest p): 'R=6 is not told from R=10 (0.49% higher, adjusted p=0.07) with 3 seeds each; it beats R=2
    (...)', each gap in the metric's direction (`differs`)."""
    close = sorted((c for c in compared if c.p_adjusted > alpha), key=lambda c: c.p_adjusted)
    told = [c for c in compared if c.p_adjusted <= alpha]

    def said(c: Comparison) -> str:
        return f"{named(c.over)} ({differs(c.pct, metric)}, adjusted p={c.p_adjusted:.2g})"

    beats = f"; it beats {and_([said(c) for c in told])}" if told else ""
    return f"{name} is not told from {and_([said(c) for c in close], 'or')} at alpha={alpha:.3g} with {seeds}{beats}"
