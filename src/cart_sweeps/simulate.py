"""The ladder and sequential seeds against the paper's fixed design and the floor, on studies with a known truth
(`python -m cart_sweeps.simulate`; truths, designs and scoring: docs/ladder.md, "The simulation"). The paper
publishes no seed spread: `--sd` 0.5% and 1% of log-perplexity bracket what the project's tests assume."""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import cast

import numpy as np
from omegaconf import OmegaConf

from cart_sweeps.compose import compose_config
from cart_sweeps.config import ModelConfig
from cart_sweeps.metric import require
from cart_sweeps.model import train_flops_per_token
from cart_sweeps.rules.axes import P as P_KEY
from cart_sweeps.rules.axes import R as R_KEY
from cart_sweeps.rules.bound import floor
from cart_sweeps.rules.decide import ALPHA, SEEDS, best_level, look_level
from cart_sweeps.rules.ladder_walk import PAPER_HORIZONS, Design, walk
from cart_sweeps.rules.zoom import promoted

WIDTHS = (256, 512, 768, 1024)
GRID_R, GRID_P = (2, 4, 6, 8), (2, 3, 4, 6)
EXTRA_R, EXTRA_P = 10, 8  # what the zoom may add past the grid's edge
RUNGS = (3000, 10000, 30500)
METRIC = require("ppl_wiki")
# (seq_len, tokens per step): the paper's Stage-1 and Stage-2 recipes
SCREEN_RECIPE, CONFIRM_RECIPE = (512, 16384), (1024, 32768)
# Stage 1 at 3,000 steps, P=6 (REFERENCE.md section 5); R=10 there: 0.5% behind R=8 (not run by the paper)
PAPER_3000 = {
    256: {2: 185.7, 4: 185.3, 6: 184.9, 8: 186.2},
    512: {2: 138.8, 4: 137.9, 6: 137.4, 8: 136.4},
    768: {2: 118.3, 4: 116.4, 6: 116.0, 8: 115.0},
    1024: {2: 103.1, 4: 101.1, 6: 98.75, 8: 97.73},
}
PAPER_30500 = {  # Stage 2, 3-seed means; R=2 and R=4 not run by the paper (set below)
    256: {6: 41.165, 8: 40.311, 10: 40.714},
    512: {6: 27.097, 8: 27.203, 10: 27.378},
    768: {6: 22.850, 8: 22.863, 10: 22.961},
    1024: {6: 20.354, 8: 20.402, 10: 20.495},
}
# P's log offsets behind P=6 (unpublished beyond "P=6 > 4 > 3 > 2"; P=8: the zoom's extension)
P_3000 = {2: 0.06, 3: 0.04, 4: 0.02, 6: 0.0, 8: 0.005}
P_30500 = {2: 0.04, 3: 0.025, 4: 0.012, 6: 0.0, 8: 0.005}
Config = tuple[tuple[str, int], ...]


def config(r: int, p: int) -> Config:
    return ((R_KEY, r), (P_KEY, p))


def _paper_r(d: int) -> tuple[dict[int, float], dict[int, float]]:
    """R's log effect at 3,000 and 30,500 at width d, relative to R=6."""
    early = {r: math.log(v / PAPER_3000[d][6]) for r, v in PAPER_3000[d].items()}
    early[EXTRA_R] = early[8] + 0.005
    late = {r: math.log(v / PAPER_30500[d][6]) for r, v in PAPER_30500[d].items()}
    best = min(late.values())
    late |= {2: best + 0.03, 4: best + 0.012}
    return early, late


def _ties(d: int) -> tuple[dict[int, float], dict[int, float]]:
    early, _ = _paper_r(d)
    return early, {2: 0.03, 4: 0.012, 6: 0.0, 8: 0.0, 10: 0.005}


def _flat(d: int) -> tuple[dict[int, float], dict[int, float]]:
    zero = {r: 0.0 for r in (*GRID_R, EXTRA_R)}
    return zero, dict(zero)


def _clear(d: int) -> tuple[dict[int, float], dict[int, float]]:
    early = {2: 0.02, 4: 0.01, 6: 0.01, 8: 0.0, 10: 0.005}
    return early, {r: (0.0 if r == 6 else 0.03) for r in (*GRID_R, EXTRA_R)}


def _screen(d: int) -> tuple[dict[int, float], dict[int, float]]:
    """The paper's Stage-1 table kept to the last horizon (up to 5% behind at d=1024), nothing reversing."""
    early, _ = _paper_r(d)
    return early, dict(early)


def _screen_ties(d: int) -> tuple[dict[int, float], dict[int, float]]:
    """The screen's clearly worse cells, with its two best R tied exactly at the last horizon."""
    early, _ = _paper_r(d)
    top = min(early[6], early[8])
    return early, {**early, 6: top, 8: top, EXTRA_R: top + 0.005}


TRUTHS: dict[str, Callable[[int], tuple[dict[int, float], dict[int, float]]]] = {
    "paper": _paper_r,
    "ties": _ties,
    "flat_r": _flat,
    "clear": _clear,
    "screen": _screen,
    "screen_ties": _screen_ties,
}
# P's offsets per truth (the screens: the Stage-1 spread of P, up to 6% behind P=6, kept to the last horizon)
P_LATE = {"screen": P_3000, "screen_ties": P_3000}


def truth(kind: str, d: int, horizon: int) -> dict[Config, float]:
    """True log-perplexity offsets of every configuration (grid and zoom extensions) at `horizon`."""
    early, late = TRUTHS[kind](d)
    p_late = P_LATE.get(kind, P_30500)
    span = math.log(PAPER_HORIZONS[1] / PAPER_HORIZONS[0])
    w = min(1.0, max(0.0, math.log(horizon / PAPER_HORIZONS[0]) / span))
    return {
        config(r, p): (1 - w) * (early[r] + P_3000[p]) + w * (late[r] + p_late[p])
        for r in (*GRID_R, EXTRA_R)
        for p in (*GRID_P, EXTRA_P)
    }


@cache
def _paper_model() -> ModelConfig:
    return cast(ModelConfig, OmegaConf.to_object(compose_config(["scale=paper"]).model))


@cache
def flops(d: int, r: int, p: int, seq_len: int) -> float:
    """Training FLOPs per token of a CART model at the paper's head size and vocabulary (a paper-scale run's)."""
    return train_flops_per_token(replace(_paper_model(), d_model=d, n_loops=r, n_prelude=p), seq_len)


def run_cost(d: int, c: Config, steps: int, recipe: tuple[int, int]) -> float:
    r, p = dict(c)[R_KEY], dict(c)[P_KEY]
    return flops(d, r, p, recipe[0]) * recipe[1] * steps


@dataclass(frozen=True)
class Outcome:
    """One design on one width of one study: decided (a best, or equivalent within the margin), false, cost."""

    decided: bool
    equivalent: bool
    false: bool
    cost: float

    @property
    def right(self) -> bool:
        return self.decided and not self.equivalent and not self.false


def _outcome(
    decided: bool,
    choice: Config | None,
    within: Sequence[Config],
    ran: Sequence[Config],
    final: dict[Config, float],
    cost: float,
    margin: float | None,
) -> Outcome:
    """A decision over the configurations `ran` (`choice` best, `within` equivalent, the rest worse); false where
    an equivalent one is truly past the margin or a worse one truly no worse (a tie has no best)."""
    if not decided or choice is None:
        return Outcome(False, False, False, cost)
    near = any(abs(final[c] - final[choice]) > (margin or 0.0) for c in within)
    beaten = [c for c in ran if c != choice and c not in within]
    false = near or any(final[c] - final[choice] < 1e-12 for c in beaten)
    return Outcome(True, bool(within), false, cost)


def _draw(rng: np.random.Generator, mean: float, sd: float, n: int) -> list[float]:
    return list(np.exp(math.log(30.0) + mean + sd * rng.normal(size=n)))


def fixed(
    kind: str,
    d: int,
    sd: float,
    rng: np.random.Generator,
    select: str,
    seeds: int = 3,
    most: int | None = None,
    margin: float | None = None,
) -> Outcome:
    """The paper's two stages on width d: the one-seed screen, then `seeds` per candidate (zoom's, or the paper's
    R); `most`: one more while undecided up to it, each look at its spent alpha. Claims: over what it ran."""
    early, final = truth(kind, d, RUNGS[0]), truth(kind, d, RUNGS[-1])
    screen = {config(r, p): _draw(rng, early[config(r, p)], sd, 1)[0] for r in GRID_R for p in GRID_P}
    cost = sum(run_cost(d, c, RUNGS[0], SCREEN_RECIPE) for c in screen)
    ranked = [(dict(c)[R_KEY], dict(c)[P_KEY]) for c in sorted(screen, key=screen.__getitem__)]
    chosen = [config(r, p) for r, p in (promoted(ranked) if select == "zoom" else [(r, 6) for r in (6, 8, 10)])]
    values = {c: _draw(rng, final[c], sd, most or seeds) for c in chosen}
    looks = 1 if most is None else most - seeds + 1
    for look in range(1, looks + 1):
        have = seeds + look - 1
        verdict = best_level({c: v[:have] for c, v in values.items()}, METRIC, equivalence=margin,
                             level=look_level(ALPHA, look, looks))  # fmt: skip
        if verdict.decided:
            break
    cost += sum(have * run_cost(d, c, RUNGS[-1], CONFIRM_RECIPE) for c in chosen)
    return _outcome(verdict.decided, verdict.choice, verdict.equivalent, chosen, final, cost, margin)


def ladder(kind: str, sd: float, rng: np.random.Generator, design: Design) -> dict[int, Outcome]:
    """The ladder over the four widths of one study (one walk, as one stage), run until it wants nothing."""
    rungs = design.rungs
    groups = {d: [config(r, p) for r in GRID_R for p in GRID_P] for d in WIDTHS}
    truths = {(k, d): truth(kind, d, h) for k, h in enumerate(rungs) for d in WIDTHS}
    data: dict[tuple[int, int, Config], dict[int, float]] = defaultdict(dict)
    cost: dict[int, float] = defaultdict(float)
    while not (state := walk(design, groups, data)).finished:
        for want in state.wants:
            mean = truths[(want.rung, want.group)][want.config]
            branched = want.seed in data.get((want.rung - 1, want.group, want.config), {})
            data[(want.rung, want.group, want.config)][want.seed] = _draw(rng, mean, sd, 1)[0]
            steps = design.steps(want.rung, branched)
            cost[want.group] += run_cost(want.group, want.config, steps, CONFIRM_RECIPE)
    final = {d: state.ended[d][1] for d in WIDTHS}
    return {
        d: _outcome(
            not j.open, j.best, j.equivalent, groups[d], truths[(len(rungs) - 1, d)], cost[d], design.equivalence
        )
        for d, j in final.items()
    }


def bound(kind: str, d: int, sd: float, margin: float | None) -> float:
    """The floor on one width's compute (rules/bound.py) over the grid's configurations at the last horizon."""
    final = truth(kind, d, RUNGS[-1])
    grid = sorted((config(r, p) for r in GRID_R for p in GRID_P), key=final.__getitem__)
    gaps = [final[c] - final[grid[0]] for c in grid]
    return floor(gaps, sd, ALPHA, margin, [run_cost(d, c, RUNGS[-1], CONFIRM_RECIPE) for c in grid])


@dataclass(frozen=True)
class Row:
    truth: str
    design: str
    right: float  # share of widths decided on the true final winner
    equivalent: float  # share decided equivalent within the margin, rightly
    undecided: float
    false: float  # share decided wrongly (a wrong best, or "equivalent" past the margin)
    compute: float  # mean FLOPs, as a share of fixed (zoom)'s
    over_bound: float  # mean FLOPs over the floor's (rules/bound.py)


def design(rungs: Sequence[int] = RUNGS, first: int = 2, most: int = 3, branch: float | None = None,
           equivalence: float | None = None) -> Design:  # fmt: skip
    """A ladder the simulation runs (`branch`: a branched ladder's decay fraction; None: fresh runs)."""
    return Design(tuple(rungs), tuple(SEEDS), first, most, METRIC, branch=branch, equivalence=equivalence)


def ladders(rungs: Sequence[int] = RUNGS, first: int = 2, most: int = 3, decay: float = 0.2,
            equivalence: float | None = None) -> dict[str, Design]:  # fmt: skip
    """The ladders the table shows: fresh runs, and the same ladder branched."""
    return {
        "ladder": design(rungs, first, most, equivalence=equivalence),
        "ladder (branch)": design(rungs, first, most, decay, equivalence),
    }


SEQUENTIAL = (2, 8)  # the seeds design: 2 seeds per zoom candidate, one more per round while undecided, up to 8
EQUAL_MOST = 16  # fixed (equal) raises the zoom's seeds per candidate up to this


def simulate(reps: int, sd: float = 0.005, seed: int = 0, designs: dict[str, Design] | None = None,
             truths: Sequence[str] = tuple(TRUTHS), equivalence: float | None = None) -> list[Row]:  # fmt: skip
    """Every truth x design over `reps` studies of four widths; `equivalence`: every design's margin."""
    chosen = designs if designs is not None else ladders(equivalence=equivalence)
    rows = []
    for i, kind in enumerate(truths):
        rng = np.random.default_rng([seed, i])
        runs: dict[str, list[Outcome]] = defaultdict(list)
        for _ in range(reps):
            for d in WIDTHS:
                runs["fixed (zoom)"].append(fixed(kind, d, sd, rng, "zoom", margin=equivalence))
                runs["fixed (paper)"].append(fixed(kind, d, sd, rng, "paper", margin=equivalence))
                runs["seeds"].append(fixed(kind, d, sd, rng, "zoom", *SEQUENTIAL, margin=equivalence))
            for label, one in chosen.items():
                runs[label] += ladder(kind, sd, rng, one).values()
        runs["fixed (equal)"] = _equal(kind, sd, seed, i, reps, runs, equivalence)
        base = float(np.mean([o.cost for o in runs["fixed (zoom)"]]))
        floor_cost, nan = float(np.mean([bound(kind, d, sd, equivalence) for d in WIDTHS])), math.nan
        rows.append(
            Row(kind, "bound", nan, nan, nan, nan, floor_cost / base, 1.0 if math.isfinite(floor_cost) else nan)
        )
        for label in ["fixed (equal)", "fixed (zoom)", "fixed (paper)", "seeds", *chosen]:
            got = runs[label]
            shares = np.mean([[o.right, o.equivalent and not o.false, not o.decided, o.false] for o in got], axis=0)
            cost = float(np.mean([o.cost for o in got]))
            over = cost / floor_cost if math.isfinite(floor_cost) else nan
            right, equivalent, undecided, false = (float(x) for x in shares)
            rows.append(Row(kind, label, right, equivalent, undecided, false, cost / base, over))
    return rows


def _equal(kind: str, sd: float, seed: int, i: int, reps: int, runs: dict[str, list[Outcome]],
           margin: float | None) -> list[Outcome]:  # fmt: skip
    """fixed (equal): fixed (zoom) with its seeds raised (3 ... EQUAL_MOST) until it decides rightly as often as
    `seeds` (the last tried where none does)."""
    target = sum(o.decided and not o.false for o in runs["seeds"]) / len(runs["seeds"])
    for n in range(3, EQUAL_MOST + 1):
        rng = np.random.default_rng([seed, i, n])
        got = [fixed(kind, d, sd, rng, "zoom", n, margin=margin) for _ in range(reps) for d in WIDTHS]
        if sum(o.decided and not o.false for o in got) / len(got) >= target:
            break
    return got


def table(rows: Sequence[Row]) -> str:
    head = (
        f"{'truth':11} {'design':15} {'right':>6} {'equivalent':>10} {'undecided':>9} {'false':>6} {'compute':>8} "
        f"{'compute/bound':>13}"
    )
    lines = [head, "-" * len(head)]

    def share(x: float, width: int) -> str:
        return f"{'-':>{width}}" if math.isnan(x) else f"{x:{width}.3f}"

    for r in rows:
        lines.append(
            f"{r.truth:11} {r.design:15} {share(r.right, 6)} {share(r.equivalent, 10)} {share(r.undecided, 9)} "
            f"{share(r.false, 6)} {r.compute:8.2f} {share(r.over_bound, 13)}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cart_sweeps.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=200, help="studies (of four widths) per truth")
    parser.add_argument("--sd", type=float, default=0.005, help="seed s.d. of log-perplexity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=2, help="the ladder's grid seeds per cell")
    parser.add_argument("--most", type=int, default=3, help="the ladder's stage.max_seeds")
    parser.add_argument("--rungs", type=int, nargs="+", default=list(RUNGS), help="the ladder's horizons")
    parser.add_argument("--decay", type=float, default=0.2, help="the branched ladder's wsd decay fraction")
    parser.add_argument("--equivalence", type=float, default=None, help="the relative margin (0.01: 1%%)")
    parser.add_argument("--truths", nargs="+", default=list(TRUTHS), choices=list(TRUTHS))
    args = parser.parse_args(argv)
    chosen = ladders(args.rungs, args.first, args.most, args.decay, args.equivalence)
    d = chosen["ladder"]
    print(
        f"{args.reps} studies x 4 widths per truth; seed s.d. {args.sd:.2%} of log-perplexity; alpha {ALPHA}; "
        f"ladder rungs {list(d.rungs)}, {d.first} seeds (at most {d.most}), prior drift {d.prior:.2%} per "
        f"ln-horizon; branched: decay fraction {args.decay}; seeds: {SEQUENTIAL[0]} per zoom candidate, up to "
        f"{SEQUENTIAL[1]}, alpha spent O'Brien-Fleming-like; equivalence margin "
        f"{'none' if args.equivalence is None else f'{args.equivalence:.2%}'}; compute: share of fixed (zoom)'s"
    )
    print(table(simulate(args.reps, args.sd, args.seed, chosen, args.truths, args.equivalence)))


if __name__ == "__main__":
    main()
