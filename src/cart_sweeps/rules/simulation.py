"""The ladder and sequential seeds against the paper's fixed design and the floor, on studies with a known truth
(`python -m cart_sweeps.simulate`, and `plan`'s expected compute of a stage's own grid; truths, designs and
scoring: docs/ladder.md, "The simulation"). Here, beside the rules, so that a rule can price itself. The paper
publishes no seed spread: `--sd` 0.5% and 1% of log-perplexity bracket what the project's tests assume."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from omegaconf import OmegaConf

from cart_sweeps.compose import compose_config
from cart_sweeps.config import ModelConfig
from cart_sweeps.metric import require
from cart_sweeps.model import train_flops_per_token
from cart_sweeps.rules.axes import D
from cart_sweeps.rules.axes import P as P_KEY
from cart_sweeps.rules.axes import R as R_KEY
from cart_sweeps.rules.bound import floor
from cart_sweeps.rules.decide import ALPHA, PRIOR_SD, SEEDS, best_level, look_level
from cart_sweeps.rules.ladder_walk import PAPER_HORIZONS, Design, walk
from cart_sweeps.rules.zoom import drift_allowance, ordered, screen

if TYPE_CHECKING:
    from cart_sweeps.rules.rule import Expanded

WIDTHS = (256, 512, 768, 1024)
GRID_R, GRID_P = (2, 4, 6, 8), (2, 3, 4, 6)
EXTRA_R, EXTRA_P = 10, 8  # what the zoom may add past the grid's edge
RUNGS = (3000, 10000, 30500)
METRIC = require("ppl_wiki")
ZOOM_ALLOWANCE = drift_allowance(RUNGS[0], RUNGS[-1])  # the zoom's: from the screen's horizon to the confirm's
PAPER_R = [(r, 6) for r in (6, 8, 10)]  # Stage 2 as shipped: R at P=6
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
Grid = list[tuple[int, list[Config]]]  # the decision groups: each its width and its configurations


def config(r: int, p: int) -> Config:
    return ((R_KEY, r), (P_KEY, p))


PAPER_CELLS = [config(r, p) for r in GRID_R for p in GRID_P]
PAPER_GRID: Grid = [(d, PAPER_CELLS) for d in WIDTHS]
SUPPORT = {config(r, p) for r in (*GRID_R, EXTRA_R) for p in (*GRID_P, EXTRA_P)}  # what the truths name


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
    cells: Sequence[Config] = PAPER_CELLS,
) -> Outcome:
    """The paper's two stages on width d's `cells`: the one-seed screen, then `seeds` per candidate (zoom's, as far
    as the truths name them, or the paper's R; `grid`: every cell, no screen); `most`: one more while undecided up
    to it, each look at its spent alpha. Claims: over what it ran."""
    early, final = truth(kind, d, RUNGS[0]), truth(kind, d, RUNGS[-1])
    chosen, cost = list(cells), 0.0
    if select != "grid":
        drawn = {c: _draw(rng, early[c], sd, 1) for c in cells}
        cost = sum(run_cost(d, c, RUNGS[0], SCREEN_RECIPE) for c in drawn)
        screened = {(dict(c)[R_KEY], dict(c)[P_KEY]): v for c, v in drawn.items()}
        zoomed = select == "zoom"
        promoted = screen(d, ordered(screened, METRIC), METRIC, ZOOM_ALLOWANCE).cells if zoomed else PAPER_R
        chosen = [c for c in (config(r, p) for r, p in promoted) if c in SUPPORT]
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


def ladder(kind: str, sd: float, rng: np.random.Generator, design: Design, grid: Grid = PAPER_GRID) -> list[Outcome]:
    """The ladder over the groups of one study (one walk, as one stage), run until it wants nothing."""
    rungs = design.rungs
    groups = {i: cells for i, (_, cells) in enumerate(grid)}
    truths = {(k, i): truth(kind, d, h) for k, h in enumerate(rungs) for i, (d, _) in enumerate(grid)}
    data: dict[tuple[int, int, Config], dict[int, float]] = defaultdict(dict)
    cost: dict[int, float] = defaultdict(float)
    while not (state := walk(design, groups, data)).finished:
        for want in state.wants:
            mean = truths[(want.rung, want.group)][want.config]
            branched = want.seed in data.get((want.rung - 1, want.group, want.config), {})
            data[(want.rung, want.group, want.config)][want.seed] = _draw(rng, mean, sd, 1)[0]
            steps = design.steps(want.rung, branched)
            cost[want.group] += run_cost(grid[want.group][0], want.config, steps, CONFIRM_RECIPE)
    last = len(rungs) - 1
    return [
        _outcome(not j.open, j.best, j.equivalent, groups[i], truths[(last, i)], cost[i], design.equivalence)
        for i, j in ((i, state.ended[i][1]) for i in groups)
    ]


def bound(kind: str, d: int, sd: float, margin: float | None, cells: Sequence[Config] = PAPER_CELLS) -> float:
    """The floor on one width's compute (rules/bound.py) over its configurations at the last horizon."""
    final = truth(kind, d, RUNGS[-1])
    grid = sorted(cells, key=final.__getitem__)
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
    runs: float  # mean FLOPs per group in full-length runs (a group's mean run at the last horizon)
    compute_se: float  # the standard error of `compute` over the draws


@cache
def shipped() -> tuple[tuple[int, ...], int, int]:
    """The shipped ladder (sweeps/ladder.yaml): its rungs, grid seeds and stage.max_seeds, the simulator's own."""
    spec = compose_config(["stage=ladder"]).stage
    return tuple(spec.rungs), len(spec.grid["seed"]), int(spec.max_seeds)


def design(rungs: Sequence[int] | None = None, first: int | None = None, most: int | None = None,
           branch: float | None = None, equivalence: float | None = None) -> Design:  # fmt: skip
    """A ladder the simulation runs, the shipped one's where not given (`branch`: a branched ladder's decay
    fraction; None: fresh runs)."""
    default = shipped()
    rungs, first, most = rungs or default[0], first or default[1], most or default[2]
    return Design(tuple(rungs), tuple(SEEDS), first, most, METRIC, branch=branch, equivalence=equivalence)


def ladders(rungs: Sequence[int] | None = None, first: int | None = None, most: int | None = None,
            decay: float = 0.2, equivalence: float | None = None) -> dict[str, Design]:  # fmt: skip
    """The ladders the table shows: fresh runs, and the same ladder branched."""
    return {
        "ladder": design(rungs, first, most, equivalence=equivalence),
        "ladder (branch)": design(rungs, first, most, decay, equivalence),
    }


SD = PRIOR_SD  # the seed s.d. of log-perplexity the tables assume: the one the zoom states
SEQUENTIAL = (2, 8, "zoom")  # the seeds design: 2 seeds per zoom candidate, one more per round while undecided, to 8
EQUAL_MOST = 16  # fixed (equal) raises the zoom's seeds per candidate up to this


def simulate(reps: int, sd: float = SD, seed: int = 0, designs: dict[str, Design] | None = None,
             truths: Sequence[str] = tuple(TRUTHS), equivalence: float | None = None, grid: Grid = PAPER_GRID,
             sequential: tuple[int, int, str] = SEQUENTIAL) -> list[Row]:  # fmt: skip
    """Every truth x design over `reps` studies of `grid`'s groups (the paper's four widths); `equivalence`: every
    design's margin; `sequential`: the seeds design's grid seeds, most seeds and candidates (fixed's `select`)."""
    chosen = designs if designs is not None else ladders(equivalence=equivalence)
    first, most, select = sequential
    rows = []
    for i, kind in enumerate(truths):
        rng = np.random.default_rng([seed, i])
        runs: dict[str, list[Outcome]] = defaultdict(list)
        for _ in range(reps):
            for d, cells in grid:
                runs["fixed (zoom)"].append(fixed(kind, d, sd, rng, "zoom", margin=equivalence, cells=cells))
                runs["fixed (paper)"].append(fixed(kind, d, sd, rng, "paper", margin=equivalence, cells=cells))
                runs["seeds"].append(fixed(kind, d, sd, rng, select, first, most, equivalence, cells))
            for label, one in chosen.items():
                runs[label] += ladder(kind, sd, rng, one, grid)
        runs["fixed (equal)"] = _equal(kind, sd, seed, i, reps, runs, equivalence, grid)
        base = float(np.mean([o.cost for o in runs["fixed (zoom)"]]))
        unit = float(
            np.mean([np.mean([run_cost(d, c, RUNGS[-1], CONFIRM_RECIPE) for c in cells]) for d, cells in grid])
        )
        floor_cost, nan = float(np.mean([bound(kind, d, sd, equivalence, cells) for d, cells in grid])), math.nan
        finite = math.isfinite(floor_cost)
        rows.append(
            Row(kind, "bound", nan, nan, nan, nan, floor_cost / base, 1.0 if finite else nan, floor_cost / unit, 0.0)
        )
        for label in ["fixed (equal)", "fixed (zoom)", "fixed (paper)", "seeds", *chosen]:
            got = runs[label]
            shares = np.mean([[o.right, o.equivalent and not o.false, not o.decided, o.false] for o in got], axis=0)
            costs = np.array([o.cost for o in got])
            cost, se = float(costs.mean()), float(costs.std(ddof=1) / math.sqrt(len(costs))) if len(costs) > 1 else nan
            over = cost / floor_cost if finite else nan
            right, equivalent, undecided, false = (float(x) for x in shares)
            rows.append(
                Row(kind, label, right, equivalent, undecided, false, cost / base, over, cost / unit, se / base)
            )
    return rows


def _equal(kind: str, sd: float, seed: int, i: int, reps: int, runs: dict[str, list[Outcome]],
           margin: float | None, grid: Grid) -> list[Outcome]:  # fmt: skip
    """fixed (equal): fixed (zoom) with its seeds raised (3 ... EQUAL_MOST) until it decides rightly as often as
    `seeds` (the last tried where none does)."""
    target = sum(o.decided and not o.false for o in runs["seeds"]) / len(runs["seeds"])
    for n in range(3, EQUAL_MOST + 1):
        rng = np.random.default_rng([seed, i, n])
        got = [fixed(kind, d, sd, rng, "zoom", n, margin=margin, cells=c) for _ in range(reps) for d, c in grid]
        if sum(o.decided and not o.false for o in got) / len(got) >= target:
            break
    return got


# `plan`'s expected compute: two truths that bracket the answer, a clear winner and a tie, over few studies (a
# study of the paper's 4 widths x 16 configurations walks in about 0.1 s)
PLAN_TRUTHS = ("clear", "ties")
PLAN_REPS = 10


def stage_grid(stage: Expanded, groups: Iterable[Sequence[Any]]) -> Grid | str:
    """Each decision group's runs (one per configuration) as the truths' grid: width, R and P in paper numbers
    (the grid's, else the recipe's, else the model's); else why the truths do not cover the stage."""
    grid: Grid = []
    for runs in groups:
        keys = (D, R_KEY, P_KEY)
        points = [[run.params.get(k, stage.recipe.get(k, OmegaConf.select(run.config.cfg, k))) for k in keys]
                  for run in runs]  # fmt: skip
        widths, cells = {d for d, _, _ in points}, [config(r, p) for _, r, p in points]
        if len(widths) > 1 or len(set(cells)) < len(cells):
            return "its configurations differ in more than d_model, n_loops and n_prelude"
        if not widths <= set(PAPER_3000) or not set(cells) <= SUPPORT:
            return (
                f"the truths name d_model {sorted(PAPER_3000)}, n_loops {[*GRID_R, EXTRA_R]} and n_prelude "
                f"{[*GRID_P, EXTRA_P]} (paper numbers) only"
            )
        grid.append((widths.pop(), cells))
    return grid


def expected_lines(grid: Grid | str, design: Design | tuple[int, int], margin: float | None) -> list[str]:
    """What `plan` expects a ladder (`design`) or a stage's seeds (grid seeds, most seeds) to spend on `grid` under
    PLAN_TRUTHS, at its prior and margin, beside the fixed design and the floor."""
    if isinstance(grid, str):
        return [f"expected compute: not simulated ({grid})"]
    per = "width" if len({d for d, _ in grid}) == len(grid) else "group"
    if isinstance(design, Design):
        label, chosen, sequential = "ladder", {"ladder": replace(design, metric=METRIC)}, SEQUENTIAL
        prior = f"drift prior {design.prior:.2%} and "
    else:
        label, chosen, sequential, prior = "seeds", {}, (*design, "grid"), ""
    rows = simulate(PLAN_REPS, designs=chosen, truths=PLAN_TRUTHS, equivalence=margin, grid=grid,
                    sequential=sequential)  # fmt: skip
    by = {(r.truth, r.design): r for r in rows}
    lines = [
        f"expected compute (simulated, {PLAN_REPS} studies under {'/'.join(PLAN_TRUTHS)} at this grid: its "
        f"{len(grid)} {per}s, seed s.d. {SD:.2%} of log-perplexity, at this design's {prior}"
        f"margin {'none' if margin is None else f'{margin:.2%}'}; a run: a group's mean 30,500-step run at the "
        "paper's recipe; the fixed design: 1 seed at 3,000 steps, the zoom's candidates x 3 at 30,500; +- one "
        "standard error):"
    ]
    for kind in PLAN_TRUTHS:
        row, floor_row = by[(kind, label)], by[(kind, "bound")]
        gaps = [np.diff(sorted(truth(kind, d, RUNGS[-1])[c] for c in cells)[:2]) for d, cells in grid]
        over = (
            f"{row.over_bound:.2f}x the bound ({floor_row.runs:.1f} runs)"
            if math.isfinite(row.over_bound)
            else "no finite bound (a tie without stage.equivalence)"
        )
        if row.over_bound < 1:  # the floor counts full-length runs only (rules/bound.py)
            over += (
                ": the bound is for deciding on full-length runs; the ladder decided at a shorter rung, where the "
                "margin exceeds the drift allowance"
            )
        trails = f"here the runner-up trails the best by {float(np.mean(gaps)):.2%} at 30,500 steps"
        lines.append(
            f"  {kind} ({trails}): {row.runs:.1f} runs per {per}, {row.compute:.2f}x (+- {row.compute_se:.2f}) the "
            f"fixed design, {over}; decided {1 - row.undecided:.2f}, falsely {row.false:.2f}"
        )
    return lines
