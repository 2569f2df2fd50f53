"""Hypothesis strategies drawing valid stage files from the project's feature matrix (tests/test_generated.py).

A drawn `Study` is a stage file (a grid, a search or a ladder), the command-line settings it runs with (its
sampler, its metric or objectives) and a history of launches (a fresh root, after a copy of itself under another
name, a relaunch, a kill -9 of the driver mid-stage, its grid or rungs changed between launches). Every study
is tiny: widths 16-32 (the paper's 256-512 at scale=tiny), at most ~12 steps, a few runs per launch. `cells`
names the matrix cells a study hits, for the coverage tally.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from hypothesis import strategies as st

from cart_sweeps.options import Sampler

# The samplers a search may name: every sampler the project knows but the grid, so one another branch adds
# (gp, cmaes, nsga2, qmc, random) is drawn as soon as it exists.
SEARCH_SAMPLERS = tuple(s.value for s in Sampler if s is not Sampler.grid)
SEEDS = (42, 137, 271)  # the first of cart_sweeps.rules.decide.seed_order's list: a ladder's max_seeds adds from it
HISTORIES = ("fresh", "after_copy", "killed", "changed")  # every study is relaunched once at its end too
METRICS = {  # the command-line settings of each metric choice, and the metric its table ranks by
    "default": ((), "ppl_austen"),
    "higher": (("sweep.metric=tokens_per_s",), "tokens_per_s"),
    "objectives": (("sweep.metrics=[ppl_austen,tokens_per_s]",), "ppl_austen"),
    "objectives_ppl": (("sweep.metrics=[ppl_bible,ppl_austen]",), "ppl_bible"),
}
PLACES = ("grid", "recipe", "absent")  # where an axis (width, R, P) goes


@dataclass(frozen=True)
class Numbers:
    """The values a stage file writes, in its numbers: the run's own at scale=tiny, or the paper's mapped there."""

    name: str
    widths: tuple[int, ...]  # 16 and 32 wide at scale=tiny
    step: int  # one tiny step
    warmups: tuple[int, int]  # two warm-ups the mapping keeps apart

    def steps(self, n: int) -> int:
        return n * self.step


OWN = Numbers("own", (16, 32), 1, (1, 2))
PAPER = Numbers("paper", (256,), 100, (100, 200))  # 256 -> 32 at scale=tiny; 400 steps -> 4
NUMBERS = {"own": OWN, "paper": PAPER}


@dataclass(frozen=True)
class Study:
    """One drawn study: its stage file, its command-line settings, and the history of its launches."""

    kind: str  # grid | search | ladder
    numbers: str
    stage: dict[str, Any]
    args: tuple[str, ...]
    metric: str  # the ranking metric its table reads
    history: str
    changed: dict[str, Any] | None = None  # the stage file of the second launch (history "changed")
    cells: tuple[str, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        return str(self.stage["name"])

    def text(self, stage: dict[str, Any] | None = None) -> str:
        return yaml.safe_dump(stage or self.stage, sort_keys=False)


def _place(draw: st.DrawFn, name: str, cells: list[str], allowed: tuple[str, ...] = PLACES) -> str:
    place = draw(st.sampled_from(allowed))
    cells.append(f"{name}:{place}")
    return place


SHAPES = {  # width, R and P: the values a grid draws two of, in each numbers (a recipe takes one of the first two)
    "model.d_model": lambda n: n.widths if n is OWN else (256, 512),
    "model.n_loops": lambda n: (1, 2, 3),
    "model.n_prelude": lambda n: (1, 2),
}
OTHER_AXES = {  # another key a grid varies, in each numbers
    "lr": lambda n: ("trainer.lr", [1.0e-3, 1.0e-2]),
    "warmup": lambda n: ("trainer.warmup_steps", list(n.warmups)),
    "switch": lambda n: ("model.core_update", ["reference", "paper"]),
}


@st.composite
def shape(draw: st.DrawFn, n: Numbers, cells: list[str], axes: int) -> tuple[dict[str, list], dict[str, Any]]:
    """Width, R and P: each in the grid (at most `axes` of them), in the recipe, or absent (the scale's default)."""
    grid: dict[str, list] = {}
    recipe: dict[str, Any] = {}
    for key, options in SHAPES.items():
        values = options(n)
        place = _place(draw, key.split(".")[1], cells, PLACES if len(grid) < axes else PLACES[1:])
        if place == "grid":
            grid[key] = draw(st.lists(st.sampled_from(values), min_size=2, max_size=2, unique=True))
        elif place == "recipe":
            recipe[key] = draw(st.sampled_from(values[:2]))
    return grid, recipe


@st.composite
def grid_stage(draw: st.DrawFn, n: Numbers, name: str, cells: list[str], ladder: bool) -> dict[str, Any]:
    """A grid (or a ladder's) of at most ~6 runs a launch: one axis of two values beside 2-3 seeds, two beside one."""
    seeds = draw(st.integers(2 if ladder else 1, 3))
    cells.append(f"seeds:{seeds}")
    axes = 1 if seeds > 1 else 2
    other = draw(st.sampled_from(("none", *OTHER_AXES)))  # drawn first: width, R and P share what it leaves
    cells.append(f"other:{other}")
    grid, recipe = draw(shape(n, cells, axes - (other != "none")))
    if other != "none":
        key, values = OTHER_AXES[other](n)
        grid[key] = values
    if seeds > 1 or draw(st.booleans()):
        grid["seed"] = list(SEEDS[:seeds])
    else:
        recipe["seed"] = SEEDS[0]
    if "trainer.warmup_steps" not in grid:
        recipe["trainer.warmup_steps"] = n.warmups[0]
    stage: dict[str, Any] = {"name": name, "numbers": n.name}
    if ladder:
        rungs = draw(st.sampled_from(((4, 8), (4, 8, 12), (4, 12))))
        cells.append(f"rungs:{len(rungs)}")
        stage["rungs"] = [n.steps(r) for r in rungs]
        if draw(st.booleans()):
            stage["max_seeds"] = seeds + 1
            cells.append("max_seeds")
        if draw(st.booleans()):
            stage["drift"] = 0.5  # a wide allowance: most configurations reach the last rung
        if draw(st.booleans()):
            stage["branch"] = True
            recipe["trainer.schedule"] = "wsd"
            cells.append("branch")
        if "model.d_model" not in grid and draw(st.booleans()):  # one width, as a grid axis: the ladder's per width
            grid["model.d_model"] = [recipe.pop("model.d_model", SHAPES["model.d_model"](n)[-1])]
            cells.append("d_model:grid of one")
        if not any(len(v) > 1 for k, v in grid.items() if k not in ("seed", "model.d_model")):
            grid = {"model.n_loops": [1, 2], **grid}  # a ladder compares configurations of a width: two R
            recipe.pop("model.n_loops", None)
    else:
        recipe["trainer.steps"] = n.steps(draw(st.integers(4, 12)))
    stage["grid"] = grid
    stage["recipe"] = recipe
    return stage


SEARCH_PARAMS = {  # a search space's parameters, in each numbers: int, float, log, categorical
    "lr_log": lambda n: ("trainer.lr", {"low": 1.0e-3, "high": 1.0e-2, "log": True}),
    "lr_float": lambda n: ("trainer.lr", {"low": 1.0e-3, "high": 5.0e-3}),
    "warmup_int": lambda n: ("trainer.warmup_steps", {"low": n.warmups[0], "high": n.warmups[1]}),
    "loops_int": lambda n: ("model.n_loops", {"low": 1, "high": 2}),
    "width_choice": lambda n: ("model.d_model", {"choices": list(SHAPES["model.d_model"](n))}),
    "update_choice": lambda n: ("model.core_update", {"choices": ["reference", "paper"]}),
}


@st.composite
def search_stage(draw: st.DrawFn, n: Numbers, name: str, cells: list[str]) -> tuple[dict[str, Any], list[str]]:
    _, recipe = draw(shape(n, cells, axes=0))
    search: dict[str, Any] = {}
    if draw(st.booleans()):  # conditional: a model switch, each model's depth only where it applies
        cells.append("search:conditional")
        search["model"] = {"choices": ["cart", "dense"]}
        search["model.n_loops"] = {"low": 1, "high": 2, "when": {"model": "cart"}}
        search["model.n_layers"] = {"low": 1, "high": 2, "when": {"model": "dense"}}
        recipe.pop("model.n_loops", None)
    picked = draw(st.lists(st.sampled_from(sorted(SEARCH_PARAMS)), min_size=0 if search else 1, max_size=2))
    for param in picked:
        key, spec = SEARCH_PARAMS[param](n)
        if key not in search:
            search[key] = spec
            recipe.pop(key, None)
            cells.append(f"search:{param}")
    recipe["seed"] = SEEDS[0]
    recipe["trainer.steps"] = n.steps(draw(st.integers(4, 10)))
    if "trainer.warmup_steps" not in search:
        recipe["trainer.warmup_steps"] = n.warmups[0]
    sampler = draw(st.sampled_from(SEARCH_SAMPLERS))
    trials = draw(st.integers(2, 4))
    cells += [f"sampler:{sampler}", f"n_trials:{trials}"]
    args = [f"sweep.sampler={sampler}", f"sweep.n_trials={trials}", "sweep.startup_trials=1"]
    return {"name": name, "numbers": n.name, "search": search, "recipe": recipe}, args


def changed_stage(stage: dict[str, Any], n: Numbers) -> dict[str, Any]:
    """The stage file of a second launch: a ladder's rungs one more or one fewer; a grid with a seed more (a
    narrowed relaunch, one seed fewer, where it has three), or an R more."""
    if "rungs" in stage:
        rungs = list(stage["rungs"])
        return {**stage, "rungs": [*rungs, rungs[-1] + n.steps(4)] if len(rungs) == 2 else rungs[:2]}
    grid = dict(stage["grid"])
    loops = grid.get("model.n_loops", [])
    if 0 < len(loops) < 3 and "seed" not in grid:
        grid["model.n_loops"] = [*loops, next(r for r in (1, 2, 3) if r not in loops)]
    else:
        seeds = grid.get("seed", [stage["recipe"].get("seed", SEEDS[0])])
        grid["seed"] = list(SEEDS[: len(seeds) + 1] if len(seeds) < len(SEEDS) else SEEDS[:2])
        stage = {**stage, "recipe": {k: v for k, v in stage["recipe"].items() if k != "seed"}}
    return {**stage, "grid": grid}


@st.composite
def studies(draw: st.DrawFn) -> Study:
    cells: list[str] = []
    kind = draw(st.sampled_from(("grid", "search", "ladder")))
    n = NUMBERS[draw(st.sampled_from(sorted(NUMBERS)))]
    cells += [f"kind:{kind}", f"numbers:{n.name}"]
    name = f"gen_{kind}"
    args: list[str] = []
    if kind == "search":
        stage, args = draw(search_stage(n, name, cells))
    else:
        stage = draw(grid_stage(n, name, cells, ladder=kind == "ladder"))
    metric_choice = draw(st.sampled_from(sorted(METRICS)))
    settings, metric = METRICS[metric_choice]
    cells.append(f"metric:{metric_choice}")
    histories = HISTORIES if kind != "search" else tuple(h for h in HISTORIES if h != "changed")
    history = draw(st.sampled_from(histories))
    cells.append(f"history:{history}")
    changed = changed_stage(stage, n) if history == "changed" else None
    return Study(kind, n.name, stage, (*args, *settings), metric, history, changed, tuple(cells))
