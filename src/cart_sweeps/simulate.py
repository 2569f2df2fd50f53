"""A ladder against the paper's fixed design, on studies with a known truth:
`python -m cart_sweeps.simulate [--reps 200] [--sd 0.005] [--seed 0]` prints the table.

The truths (`TRUTHS`: paper, ties, flat_r, clear), the designs (fixed (zoom), fixed (paper), ladder, ladder
(branch)) and how a decision is scored: docs/ladder.md, "The simulation". The paper publishes no seed spread:
`--sd` 0.5% and 1% of log-perplexity bracket what the project's tests assume.
"""

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
from cart_sweeps.rules.decide import ALPHA, SEEDS, best_level
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


TRUTHS: dict[str, Callable[[int], tuple[dict[int, float], dict[int, float]]]] = {
    "paper": _paper_r,
    "ties": _ties,
    "flat_r": _flat,
    "clear": _clear,
}


def truth(kind: str, d: int, horizon: int) -> dict[Config, float]:
    """True log-perplexity offsets of every configuration (grid and zoom extensions) at `horizon`."""
    early, late = TRUTHS[kind](d)
    span = math.log(PAPER_HORIZONS[1] / PAPER_HORIZONS[0])
    w = min(1.0, max(0.0, math.log(horizon / PAPER_HORIZONS[0]) / span))
    return {
        config(r, p): (1 - w) * (early[r] + P_3000[p]) + w * (late[r] + P_30500[p])
        for r in (*GRID_R, EXTRA_R)
        for p in (*GRID_P, EXTRA_P)
    }


@cache
def _paper_model() -> ModelConfig:
    return cast(ModelConfig, OmegaConf.to_object(compose_config(["scale=paper"]).model))


@cache
def flops(d: int, r: int, p: int, seq_len: int) -> float:
    """Training FLOPs per token of a CART model at the paper's head size and vocabulary (conf/model/cart.yaml,
    composed as a paper-scale run has it)."""
    return train_flops_per_token(replace(_paper_model(), d_model=d, n_loops=r, n_prelude=p), seq_len)


def run_cost(d: int, c: Config, steps: int, recipe: tuple[int, int]) -> float:
    r, p = dict(c)[R_KEY], dict(c)[P_KEY]
    return flops(d, r, p, recipe[0]) * recipe[1] * steps


@dataclass(frozen=True)
class Outcome:
    """One design on one width of one study."""

    decided: bool
    right: bool
    cost: float


def _outcome(decided: bool, choice: Config | None, final: dict[Config, float], cost: float) -> Outcome:
    """Right: decided on the configuration truly best at the last horizon, where one is (a tie has none)."""
    best = min(final.values())
    return Outcome(decided, decided and [c for c, v in final.items() if v - best < 1e-12] == [choice], cost)


def _draw(rng: np.random.Generator, mean: float, sd: float, n: int) -> list[float]:
    return list(np.exp(math.log(30.0) + mean + sd * rng.normal(size=n)))


def fixed(kind: str, d: int, sd: float, rng: np.random.Generator, select: str) -> Outcome:
    """The paper's two stages on width d: the one-seed screen, then the confirm (zoom or the paper's fixed R)."""
    early, final = truth(kind, d, RUNGS[0]), truth(kind, d, RUNGS[-1])
    screen = {config(r, p): _draw(rng, early[config(r, p)], sd, 1)[0] for r in GRID_R for p in GRID_P}
    cost = sum(run_cost(d, c, RUNGS[0], SCREEN_RECIPE) for c in screen)
    ranked = [(dict(c)[R_KEY], dict(c)[P_KEY]) for c in sorted(screen, key=screen.__getitem__)]
    chosen = promoted(ranked) if select == "zoom" else [(r, 6) for r in (6, 8, 10)]
    values = {config(r, p): _draw(rng, final[config(r, p)], sd, 3) for r, p in chosen}
    cost += sum(3 * run_cost(d, c, RUNGS[-1], CONFIRM_RECIPE) for c in values)
    verdict = best_level(values, METRIC, ALPHA)
    return _outcome(verdict.decided, verdict.choice, final, cost)


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
    return {d: _outcome(len(j.kept) == 1, j.best, truths[(len(rungs) - 1, d)], cost[d]) for d, j in final.items()}


@dataclass(frozen=True)
class Row:
    truth: str
    design: str
    right: float  # share of widths decided on the true final winner
    undecided: float
    false: float  # share decided wrongly (a tie decided, or the wrong configuration)
    compute: float  # mean FLOPs, as a share of fixed (zoom)'s


def design(rungs: Sequence[int] = RUNGS, first: int = 2, most: int = 3, branch: float | None = None) -> Design:
    """A ladder the simulation runs: `rungs`, `first` grid seeds, up to `most` where open, the prior drift;
    `branch`: the decay fraction of a branched (wsd) ladder, None for fresh runs."""
    return Design(tuple(rungs), tuple(SEEDS), first, most, METRIC, branch=branch)


def ladders(rungs: Sequence[int] = RUNGS, first: int = 2, most: int = 3, decay: float = 0.2) -> dict[str, Design]:
    """The ladders the table shows: fresh runs, and the same ladder branched."""
    return {"ladder": design(rungs, first, most), "ladder (branch)": design(rungs, first, most, decay)}


def simulate(reps: int, sd: float = 0.005, seed: int = 0, designs: dict[str, Design] | None = None,
             truths: Sequence[str] = tuple(TRUTHS)) -> list[Row]:  # fmt: skip
    """Every truth x design (the fixed ones and `designs`, by label) over `reps` studies of four widths each."""
    chosen = designs if designs is not None else ladders()
    rows = []
    for i, kind in enumerate(truths):
        rng = np.random.default_rng([seed, i])
        runs: dict[str, list[Outcome]] = defaultdict(list)
        for _ in range(reps):
            for d in WIDTHS:
                runs["fixed (zoom)"].append(fixed(kind, d, sd, rng, "zoom"))
                runs["fixed (paper)"].append(fixed(kind, d, sd, rng, "paper"))
            for label, one in chosen.items():
                runs[label] += ladder(kind, sd, rng, one).values()
        base = float(np.mean([o.cost for o in runs["fixed (zoom)"]]))
        for label, outcomes in runs.items():
            n = len(outcomes)
            rows.append(
                Row(
                    kind,
                    label,
                    sum(o.right for o in outcomes) / n,
                    sum(not o.decided for o in outcomes) / n,
                    sum(o.decided and not o.right for o in outcomes) / n,
                    float(np.mean([o.cost for o in outcomes])) / base,
                )
            )
    return rows


def table(rows: Sequence[Row]) -> str:
    head = f"{'truth':8} {'design':15} {'right':>6} {'undecided':>9} {'false':>6} {'right|undec':>11} {'compute':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.truth:8} {r.design:15} {r.right:6.3f} {r.undecided:9.3f} {r.false:6.3f} "
            f"{r.right + r.undecided:11.3f} {r.compute:8.2f}"
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
    args = parser.parse_args(argv)
    chosen = ladders(args.rungs, args.first, args.most, args.decay)
    d = chosen["ladder"]
    print(
        f"{args.reps} studies x 4 widths per truth; seed s.d. {args.sd:.2%} of log-perplexity; alpha {ALPHA}; "
        f"ladder rungs {list(d.rungs)}, {d.first} seeds (at most {d.most}), prior drift {d.prior:.2%} per "
        f"ln-horizon; branched: decay fraction {args.decay}"
    )
    print(table(simulate(args.reps, args.sd, args.seed, chosen)))


if __name__ == "__main__":
    main()
