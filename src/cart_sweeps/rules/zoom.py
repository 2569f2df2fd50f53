"""Stage-2 candidates by the author's "zoom and confirm" rule, from the runs the Stage-1 tables use: per width
the best (R, P) and its grid neighbours along each axis (past an edge the last step repeats), every cell the
screen could not rule out against the best (docs/ladder.md, "The zoom's candidates"), and `stage.sentinels=K`
ranked just below; a width whose runs mix recipes is refused in one line."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from cart_sweeps.config import RECIPE_KEYS, ConfigError
from cart_sweeps.metric import Metric, require
from cart_sweeps.record.runfolder import CONFIG
from cart_sweeps.rules.axes import D, P, R
from cart_sweeps.rules.decide import (
    ALPHA,
    PRIOR_SD,
    Noise,
    Option,
    best_per,
    critical,
    options,
    pool,
    ranked,
    settle,
    tested_margin,
)
from cart_sweeps.rules.ladder_walk import DRIFT_PRIOR
from cart_sweeps.stagerecord.runset import RunSet, StageRun, cell_of

ZOOM_AXES = (D, R, P)
_LOWEST = {R: 1, P: 0}


def neighbours(grid: list[int], best: int, lowest: int) -> list[int]:
    """`best` and its neighbours in `grid`, extending past an edge by the last step."""
    values = sorted(set(grid))
    i = values.index(best)
    if len(values) == 1:
        return [best]
    below = values[i - 1] if i > 0 else best - (values[1] - values[0])
    above = values[i + 1] if i < len(values) - 1 else best + (values[-1] - values[-2])
    return [v for v in (below, best, above) if v >= lowest]


def _scored(runs: RunSet, metric: str, keys: tuple[str, ...]) -> list[tuple[float, dict[str, Any], StageRun]]:
    """(metric value, grid point in the paper's numbers, run) of each run the source's conclusions use."""
    out = []
    for run in runs.used:
        value = run.summary.value(metric) if run.summary else None
        if value is not None and all(k in run.params for k in keys):
            out.append((value, run.params, run))
    return out


def _one_recipe(runs: RunSet, d: int, width: list[StageRun], select: str) -> None:
    """Refuse a width whose runs differ in a recipe key, naming each with its values: 'trainer.lr 0.003, 1e-06'."""
    values: dict[str, set[str]] = defaultdict(set)
    for run in width:
        trainer = (run.summary.details.get("trainer") or {}) if run.summary else {}
        for key in RECIPE_KEYS:
            values[key].add(json.dumps(trainer.get(key), default=str))
    if mix := [f"trainer.{k} {', '.join(sorted(v))}" for k, v in values.items() if len(v) > 1]:
        raise ConfigError(
            f"stage.select={select}: stage {runs.stage}'s runs at d={d} mix recipes ({'; '.join(mix)}), which it "
            f"never ranks together (the analysis tables them apart): relaunch stage {runs.stage} at d={d} with one "
            "recipe"
        )


def best_single_run(runs: RunSet, metric: str) -> dict[int, dict[str, Any]]:
    """What the benchmarks stage evaluates per width: the configuration the tables' `stage2_best` names
    (decide.best_per), and of its seeds the run with the best `metric` (ties: the first folder), its R and folder."""
    record, scored = require(metric), _scored(runs, metric, (D, R))
    cells = {(p[D], cell_of(p)): p for _, p, _ in scored}
    chosen = best_per(((p[D], cell_of(p), value) for value, p, _ in scored), record)
    if not chosen:
        raise ConfigError(f"stage.select=best: stage {runs.stage} has no completed run with {metric}")
    out = {}
    for d, top in chosen.items():
        _one_recipe(runs, d, [run for _, p, run in scored if p[D] == d], "best")
        seeds = [
            (record.sign * value, str(run.folder)) for value, p, run in scored if (p[D], cell_of(p)) == (d, top.choice)
        ]
        out[d] = {R: cells[(d, top.choice)][R], "run_dir": min(seeds)[1]}
    return out


def promoted(order: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The author's cross from one width's configurations, best first: the best and its neighbours on each axis
    (`screen` adds every cell the screen cannot rule out)."""
    best_r, best_p = order[0]
    points = {(best_r, best_p)}
    points |= {(r, best_p) for r in neighbours([r for r, _ in order], best_r, _LOWEST[R])}
    points |= {(best_r, p) for p in neighbours([p for _, p in order], best_p, _LOWEST[P])}
    return sorted(points)


def sentinels(order: list[tuple[int, int]], k: int, cut: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The `k` configurations ranked just below the cutoff: the best-ranked ones not among the candidates `cut`."""
    out = set(cut)
    return [c for c in order if c not in out][:k]


def _cells(scored: list[tuple[float, dict[str, Any]]]) -> dict[tuple[int, int], list[float]]:
    values: dict[tuple[int, int], list[float]] = defaultdict(list)
    for value, params in scored:
        values[(params[R], params[P])].append(value)
    return values


def drift_allowance(screen_steps: int, confirm_steps: int, drift: float | None = None) -> float:
    """How far a gap may still close from the screen's horizon to the confirm's (paper steps): the ladder's rule,
    `drift` (stage.drift; default the paper's prior) per unit of ln(horizon)."""
    rate = DRIFT_PRIOR if drift is None else drift
    return rate * max(0.0, math.log(confirm_steps / screen_steps))


def screen_steps(runs: RunSet) -> int:
    """The screen's horizon in paper steps, from a used run's config.yaml (its scale keeps the paper's number)."""
    for run in runs.used:
        try:
            cfg = cast(DictConfig, OmegaConf.load(run.folder / CONFIG))
        except (OSError, ValueError):
            continue
        return int(cfg.scale.get("paper", {}).get("trainer.steps", cfg.trainer.steps))
    raise ConfigError(f"stage.select=zoom: no run of stage {runs.stage} holds a readable {CONFIG}")


@dataclass(frozen=True)
class Screened:
    """One width's promotion: its candidates, and of them the cells the screen could not rule out, with why."""

    width: int
    cells: list[tuple[int, int]]  # promoted (sentinels apart), sorted
    unruled: list[tuple[int, int]]  # best first: the screen best, and every cell not ruled out against it
    cross: list[tuple[int, int]]  # the author's rule: the best and its neighbours
    order: list[Option]  # every cell screened, best first
    compared: int  # the width's comparisons with its best (one Holm family)
    threshold: float  # every unruled cell's gap to the best is at most this, on the tested scale
    allowance: float  # the drift allowance on the tested scale
    noise: Noise
    drift_allowance: float  # the same, relative: what the stage was given (drift_allowance)

    def line(self) -> str:
        beyond = [c for c in self.unruled if c not in self.cross]
        named = ", ".join(f"R={r} P={p}" for r, p in beyond)
        extra = f"; beyond the best and its neighbours: {named}" if beyond else ""
        if not math.isfinite(self.threshold):
            return (
                f"d_model={self.width}: kept all {len(self.unruled)} cells: the screen rules nothing out here (one "
                f"cell, or no seed spread beyond rounding){extra}"
            )
        return (
            f"d_model={self.width}: kept {len(self.unruled)} cells the screen could not rule out (gap <= "
            f"{self.threshold:.2%}: drift allowance {self.allowance:.2%}, seed s.d. {self.noise.sd:.2%} "
            f"{self.noise.source}, Holm at alpha {ALPHA:g} over the width's {self.compared} comparisons){extra}"
        )

    def record(self) -> dict[str, Any]:
        return {
            D: self.width,
            "candidates": [list(c) for c in self.cells],
            "not_ruled_out": [list(c) for c in self.unruled],
            "threshold": self.threshold if math.isfinite(self.threshold) else None,
            "allowance": self.allowance,
            "drift_allowance": self.drift_allowance,
            "seed_sd": self.noise.sd,
            "noise": self.noise.source,
            "said": self.line(),
        }


def prior_noise(opts: Sequence[Option], metric: Metric) -> Noise:
    """PRIOR_SD on the tested scale, where no cell has two seeds to measure the noise by."""
    return Noise(tested_margin(PRIOR_SD, metric, opts[0]), math.inf, "(stated prior)", max(o.resolution for o in opts))


def measured_noise(opts: Sequence[Option]) -> Noise | None:
    """The screen's seed noise pooled over every width's options (the ladder's rung noise), where cells have seeds
    to measure it by and it is more than rounding; else None (the prior applies)."""
    noise = pool(opts, "(measured on the screen's seeds)")
    return noise if noise is not None and noise.measurable else None


def ordered(values: Mapping[tuple[int, int], Sequence[float]], metric: Metric) -> list[Option]:
    """One width's options best first, exact ties in `ranked`'s order (the smaller R, then P, first)."""
    return options({r.option: values[r.option] for r in ranked(values, metric)}, metric)


def screen(
    width: int,
    opts: Sequence[Option],
    metric: Metric,
    allowance: float,
    noise: Noise | None = None,
    alpha: float = ALPHA,
) -> Screened:
    """One width's candidates from its screen's options (levels (R, P), best first: `ordered`): the cross, and every
    cell not ruled out against the screen best by the ladder's drop test (decide.settle, Holm over the width's
    comparisons at `alpha`) beyond `allowance` (drift_allowance, relative); `noise`: measured (measured_noise),
    else the prior (prior_noise)."""
    noise = noise or prior_noise(opts, metric)
    at = tested_margin(allowance, metric, opts[0])
    unruled, threshold = [o.level for o in opts], math.inf
    if len(opts) > 1 and noise.measurable:
        adjusted = settle(opts, noise, at).adjusted
        unruled = [opts[0].level] + [o.level for o, a in zip(opts[1:], adjusted, strict=True) if a > alpha]
        level = alpha / max(1, len(unruled) - 1)  # Holm's level at the step it stopped (alpha: none kept)
        fewest = min(o.seeds for o in opts)
        threshold = at + critical(noise, level) * noise.sd * math.sqrt(1 / opts[0].seeds + 1 / fewest)
    cross = promoted([o.level for o in opts])
    cells = sorted({*cross, *unruled})
    return Screened(width, cells, unruled, cross, list(opts), len(opts) - 1, threshold, at, noise, allowance)


def zoom_candidates(
    runs: RunSet, metric: str, widths: list[int], k: int = 0, *, allowance: float
) -> tuple[list[dict[str, Any]], list[Screened]]:
    """The (d, R, P) points to confirm per width in `widths`, with `k` sentinels (stage.sentinels) each, and each
    width's promotion; `allowance`: from the screen's horizon to the confirm's (drift_allowance)."""
    by_width: dict[int, list[tuple[float, dict[str, Any], StageRun]]] = defaultdict(list)
    for value, params, run in _scored(runs, metric, ZOOM_AXES):
        by_width[params[D]].append((value, params, run))
    for d in widths:
        if not by_width.get(d):
            raise ConfigError(f"stage.select=zoom: stage {runs.stage} has no completed run with {metric} at d={d}")
        _one_recipe(runs, d, [run for _, _, run in by_width[d]], "zoom")
    screened = screens(
        {d: _cells([(value, params) for value, params, _ in by_width[d]]) for d in widths}, metric, allowance
    )
    out = []
    for found in screened:
        order = [o.level for o in found.order]
        cells = sorted([*found.cells, *sentinels(order, k, found.cells)])
        out += [{D: found.width, R: r, P: p} for r, p in cells]
    return out, screened


def screens(
    values: Mapping[int, Mapping[tuple[int, int], Sequence[float]]], metric: str, allowance: float
) -> list[Screened]:
    """Each width's promotion from its screen's values per (R, P) (`screen`, at the noise pooled over every width
    given): the zoom stage's candidates and the analysis's promotion audit, one rule."""
    record = require(metric)
    opts = {d: ordered(cells, record) for d, cells in values.items()}
    noise = measured_noise([o for d in values for o in opts[d]])
    return [screen(d, opts[d], record, allowance, noise) for d in values]
