"""The study's claims, one builder per table that makes one (the best R per stage and width, the reversal,
the P ordering, each ablation, parity, the best inference R), and the marks those tables carry: a table
says what its claim's record says, so an undecided claim reads as undecided there too. Which table makes which
claim and carries which mark is its record's fields (analysis/registry.py), one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from cart_sweeps.rules.decide import holm, p_better, pool

from .decisions import (
    NO_SPREAD,
    SIDES,
    Decision,
    best,
    best_of,
    grouped_options,
    label,
    look_alpha,
    margin,
    method_text,
    options,
    pooled_noise,
    seeds_text,
    unmeasured,
)
from .load import ppl_sets
from .stages import ABLATIONS, CONFIRM, PARITY, SCREEN, VARIABLE_R
from .tables import CONFIG, ablation_runs, inference_runs, p_reference, parity_cart, rows_of, select

Make = Callable[[pd.DataFrame, pd.DataFrame, str, float], list[Decision]]  # (table, final rows, metric, alpha)
Apply = Callable[[pd.DataFrame, list[Decision]], pd.DataFrame]


@dataclass(frozen=True)
class Claims:
    """The claims a table makes (a field of its record in analysis/registry.py): each a Decision made from the
    table's rows and every run's final row; `reads` names the table's columns it reads (tested against them)."""

    make: Make
    reads: tuple[str, ...] = ()

    def __call__(self, table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float) -> list[Decision]:
        _has(table, self.reads, "claims")
        return self.make(table, final, metric, alpha)


@dataclass(frozen=True)
class Mark:
    """How a table carries its claims (a field of its record): the columns it reads and the ones it adds."""

    apply: Apply
    reads: tuple[str, ...]
    adds: tuple[str, ...]

    def __call__(self, table: pd.DataFrame, claims: list[Decision]) -> pd.DataFrame:
        _has(table, self.reads, "mark")
        return self.apply(table, claims)


def _has(table: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    """A claim or mark reading a column its table lacks is the registry's mistake, said at once."""
    if missing := [c for c in columns if c not in table.columns]:
        raise KeyError(f"the table's {what} reads {missing}, which it lacks (have {list(table.columns)})")


def _best_r(stage: str) -> Make:
    """Per row (d, P) of a stage's best table: is its R the best of the stage's R at that d and P?"""

    def claims(table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float) -> list[Decision]:
        rows = select(final, (stage,))
        every = best(rows, metric, "n_loops", ["d_model", "n_prelude"], stage=stage, claim="best_R", alpha=alpha)
        wanted = set(zip(table["d"], table["P"], strict=True))
        return [d for d in every if (d.cell["d_model"], d.cell["n_prelude"]) in wanted]

    return claims


def reversal(table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float) -> list[Decision]:
    """Per width: does Stage 2 reverse Stage 1's pick of R (another R beats it over Stage 2's seeds:
    one-sided tests, Holm over the other R), or confirm it (the pick is Stage 2's decided best)?"""
    rows = select(final, (CONFIRM,))
    groups, level = grouped_options(rows, metric, "n_loops", ["d_model", "n_prelude"]), look_alpha(rows, alpha)
    stage_noise = pool([o for opts in groups.values() for o in opts], f"the seeds of stage {CONFIRM}")
    out = []
    for _, r in table.iterrows():
        cell = {"d_model": r["d"], "n_prelude": r["P"]}
        opts, pick = groups.get((r["d"], r["P"]), []), r["stage1_R"]
        base = Decision("reversal", CONFIRM, cell, "n_loops", None, False, "", alpha=level(opts), metric=metric)
        if pd.isna(pick):
            out.append(replace(base, why=f"no Stage-1 runs at d={r['d']} P={r['P']}"))
        elif pick not in {o.level for o in opts}:
            out.append(replace(base, why=f"Stage 1's pick R={pick} was not run in Stage 2"))
        else:
            noise = pool(opts, "the options' seeds") or stage_noise
            top = best_of(opts, noise, "reversal", CONFIRM, cell, "n_loops", level(opts), metric)
            out.append(_reversal_at(top, opts, pick, metric))
    return out


def _reversal_at(top: Decision, opts: list, pick: Any, metric: str) -> Decision:
    """The reversal claim at one width from Stage 2's best-of-k decision there (`top`) and its options."""
    if top.choice == pick:  # confirmed where Stage 2 decides that its best is the pick
        why = f"Stage 2 ranks Stage 1's pick R={pick} first too" + ("" if top.decided else f", but {top.why}")
        return replace(top, choice="confirmed", why=why)
    if (lack := unmeasured(top.noise)) is not None or top.noise is None:
        return replace(top, choice="reversed", why=f"{lack} in Stage 2 to tell R={top.choice} from R={pick}")
    picked = next(o for o in opts if o.level == pick)
    others = [o for o in opts if o.level != pick]
    p = float(holm(np.array([p_better(o, picked, top.noise) for o in others])).min())
    decided = p <= top.alpha
    if decided:
        why = f"R={top.choice} beats Stage 1's pick R={pick}"
    else:
        seeds = seeds_text([o.seeds for o in opts])
        why = f"R={top.choice} and Stage 1's pick R={pick} are not distinguishable with {seeds} (p={p:.2g})"
    return replace(
        top,
        choice="reversed",
        decided=decided,
        tied=[] if decided else [pick],
        margin=margin(opts[0], picked, top.noise, top.alpha, metric),
        comparisons=[],  # the best-of-k's; this claim tests the other R against the pick
        p_value=p,
        method=method_text(top.noise, f"one-sided (another R beats the pick), Holm over {len(others)}"),
        why=why,
    )


def p_ordering(table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float) -> list[Decision]:
    """Per (d, R): does the ranking of P hold? Decided 'holds' when every neighbour pair of the reference
    ranking is ordered so (one-sided, Holm over the k - 1 pairs); decided 'breaks' when some pair is
    reversed (one-sided, Holm over all k(k-1)/2 pairs)."""
    groups = grouped_options(select(final, (SCREEN,)), metric, "n_prelude", ["d_model", "n_loops"])
    stage_noise = pool([o for opts in groups.values() for o in opts], f"the seeds of stage {SCREEN}")
    reference = p_reference(final, metric)
    out = []
    for (d, r), opts in groups.items():
        order = sorted(opts, key=lambda o: reference.index(o.level))
        noise = pool(opts, "the options' seeds") or stage_noise
        top = best_of(opts, noise, "p_ordering", SCREEN, {"d_model": d, "n_loops": r}, "n_prelude", alpha, metric)
        out.append(_ordering_at(top, order, metric))
    return out


def _ordering_at(top: Decision, order: list, metric: str) -> Decision:
    """The P-ordering claim at one (d, R) over its options in the reference order."""
    holds = [o.level for o in sorted(order, key=lambda o: o.rank)] == [o.level for o in order]
    choice = "holds" if holds else "breaks"
    ranking = " > ".join(str(o.level) for o in order)
    if (lack := unmeasured(top.noise)) is not None or top.noise is None or len(order) < 2:
        return replace(top, choice=choice, tied=[], why=f"{lack or NO_SPREAD}: the ranking {ranking} cannot be tested")
    if holds:
        pairs = list(zip(order, order[1:], strict=False))
        adjusted = holm(np.array([p_better(a, b, top.noise) for a, b in pairs]))
        p, decided = float(adjusted.max()), bool((adjusted <= top.alpha).all())
        weak = pairs[int(adjusted.argmax())]
        tied = [[a.level, b.level] for (a, b), q in zip(pairs, adjusted, strict=True) if q > top.alpha]
        what = f"one-sided, each neighbour of {ranking} in order, Holm over {len(pairs)}"
    else:
        pairs = [(b, a) for a, b in combinations(order, 2)]  # (the one expected worse, the one expected better)
        adjusted = holm(np.array([p_better(b, a, top.noise) for b, a in pairs]))
        p, decided = float(adjusted.min()), bool((adjusted <= top.alpha).any())
        weak = pairs[int(adjusted.argmin())]
        tied = [] if decided else [[a.level, b.level] for b, a in pairs if b.rank < a.rank]
        what = f"one-sided, some pair of {ranking} reversed, Holm over {len(pairs)}"
    word = ("holds" if holds else "breaks") if decided else "is undecided"
    return replace(
        top,
        choice=choice,
        decided=decided,
        tied=tied,
        margin=margin(*weak, top.noise, top.alpha, metric),
        comparisons=[],  # the best-of-k's; this claim tests pairs of the ranking
        p_value=p,
        method=method_text(top.noise, what),
        why=f"P ranking {ranking} {word} at the seeds' noise (p={p:.2g})",
    )


def ablation(table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float) -> list[Decision]:
    """Per switch and set: does the ablation hurt (or help)? Two-sided, against the base's seed noise: the
    options' own where they have several seeds, else that of every distinct run of the base's configuration
    (stages ablations, 2 and parity: same recipe)."""
    rows, reference, noise_runs = ablation_runs(final, metric)
    out = []
    for switch, runs in rows[rows["switch"] != "base"].groupby("switch"):
        for s in ppl_sets(runs):
            both = pd.concat([reference.assign(option="base"), runs.assign(option=switch)])
            both = both[both[s].notna()]
            source = "the base configuration's distinct runs in the ablations, 2 and parity"
            noise = pooled_noise(both, s, ["option"], "the options' seeds") or pooled_noise(
                noise_runs[noise_runs[s].notna()], s, ["config"], source
            )
            cell = {"variant": switch, "metric": s, **{k: reference[k].iloc[0] for k in CONFIG}}
            top = best_of(options(both, s, "option"), noise, "ablation", ABLATIONS, cell, "option", alpha, s)
            out.append(replace(top, choice="hurts" if top.choice == "base" else "helps"))
    return out


def parity(table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float) -> list[Decision]:
    """Per dense depth and set: is dense or CART better, over both sides' seeds (two-sided)?"""
    out = []
    for (d, depth), at in table.groupby(["d", "L"], sort=False):
        cart, _ = parity_cart(final, metric, d)
        dense = rows_of(final, (PARITY,), "parity", model="dense", base_only=False)
        dense = dense[(dense["d_model"] == d) & (dense["n_layers"] == depth)]
        for s in at["metric"]:
            both = pd.concat([cart.assign(option="cart"), dense.assign(option="dense")])
            both = both[both[s].notna()]
            noise = pooled_noise(both, s, ["option"], "the options' seeds")
            cell = {"d_model": d, "n_layers": depth, "parity": at["parity"].iloc[0], "metric": s}
            out.append(best_of(options(both, s, "option"), noise, "parity", PARITY, cell, "option", alpha, s))
    return out


def trained_r_best(table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float) -> list[Decision]:
    """Per width: which inference R is best, and is it the trained R (several source models give the
    spread; evaluations of one model at several R are paired, which the unpaired test ignores)?"""
    rows = inference_runs(final, "variable_r")
    return best(
        rows, metric, "R", ["d_model", "n_prelude", "trained_R"], stage=VARIABLE_R, claim="trained_R_best", alpha=alpha
    )


def undecided(decision: Decision) -> str:
    """A claim's mark where it is not decided."""
    return (unmeasured(decision.noise) or "undecided") if decision.method == "none" else "undecided"


def _aligned(table: pd.DataFrame, claims: list[Decision], keys: dict[str, str]) -> list[Decision]:
    """The claim of each row (keys: the claims' cell keys -> the table's columns)."""
    by = {tuple(c.cell[k] for k in keys): c for c in claims}
    return [by[tuple(row)] for row in table[list(keys.values())].itertuples(index=False)]


def _mark_best(table: pd.DataFrame, claims: list[Decision]) -> pd.DataFrame:
    """decided (yes/no) and the options the data cannot tell from the table's pick."""
    at = _aligned(table, claims, {"d_model": "d", "n_prelude": "P"})
    tied = [", ".join(label("n_loops", t) for t in c.tied) for c in at]
    return table.assign(decided=[c.decided for c in at], tied=tied, p_value=[c.p_value for c in at])


def _mark_reversal(table: pd.DataFrame, claims: list[Decision]) -> pd.DataFrame:
    """reversed: yes (decided reversal), no (decided confirmation), or why neither is decided."""
    marks = [({"reversed": "yes", "confirmed": "no"}[c.choice] if c.decided else undecided(c)) for c in claims]
    gap = [c.margin.pct if c.margin and c.choice == "reversed" else None for c in claims]
    return table.assign(reversed=marks, gap_pct=gap, p_value=[c.p_value for c in claims], note=[c.why for c in claims])


def _mark_ordering(table: pd.DataFrame, claims: list[Decision]) -> pd.DataFrame:
    """holds: yes / no where decided, else why not."""
    at = _aligned(table, claims, {"d_model": "d", "n_loops": "R"})
    marks = [({"holds": "yes", "breaks": "no"}[c.choice] if c.decided else undecided(c)) for c in at]
    return table.assign(holds=marks, p_value=[c.p_value for c in at])


def _mark_pair(keys: dict[str, str], names: dict[str, str]) -> Mark:
    """verdict per row (`_aligned` by `keys`, the columns it reads): the better side where decided, else why not."""

    def mark(table: pd.DataFrame, claims: list[Decision]) -> pd.DataFrame:
        at = _aligned(table, claims, keys)
        verdict = [names[str(c.choice)] if c.decided else undecided(c) for c in at]
        return table.assign(verdict=verdict, p_value=[c.p_value for c in at])

    return Mark(mark, tuple(keys.values()), ("verdict", "p_value"))


SCREEN_BEST = Claims(_best_r(SCREEN), ("d", "P"))
CONFIRM_BEST = Claims(_best_r(CONFIRM), ("d", "P"))
REVERSAL = Claims(reversal, ("d", "P", "stage1_R"))
P_ORDERING = Claims(p_ordering)
ABLATION = Claims(ablation)
PARITY_SIDE = Claims(parity, ("d", "L", "metric", "parity"))
TRAINED_R_BEST = Claims(trained_r_best)
MARK_BEST = Mark(_mark_best, ("d", "P"), ("decided", "tied", "p_value"))
MARK_REVERSAL = Mark(_mark_reversal, (), ("reversed", "gap_pct", "p_value", "note"))
MARK_ORDERING = Mark(_mark_ordering, ("d", "R"), ("holds", "p_value"))
MARK_ABLATION = _mark_pair({"variant": "variant", "metric": "metric"}, {"hurts": "hurts", "helps": "helps"})
MARK_PARITY = _mark_pair(
    {"d_model": "d", "n_layers": "L", "metric": "metric"}, {k: f"{v} better" for k, v in SIDES.items()}
)


def _named(claim: Decision, stage: str) -> Decision:
    """A claim made of a role's runs, named by the stage playing the role (its noise's source too)."""
    noise = claim.noise
    if noise is not None:
        noise = replace(noise, source=noise.source.replace(f"stage {claim.stage}", f"stage {stage}"))
    return replace(claim, stage=stage, role=claim.stage, noise=noise)


def decide(
    claims: Claims | None, mark: Mark | None, table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float
) -> tuple[pd.DataFrame, list[Decision]]:
    """The claims a table makes (its record's `claims`), and the table with their marks (its `mark`; unchanged
    where it makes none). A claim names its stage: the stage playing the role the claim reads."""
    if claims is None:
        return table, []
    stages = dict(zip(final["role"], final["stage"], strict=True)) if "role" in final else {}
    made = claims(table, final, metric, alpha)  # each names the role it reads as its stage
    named = [_named(c, stages.get(c.stage, c.stage)) for c in made]
    return (mark(table, named) if mark else table), named
