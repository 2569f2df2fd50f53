"""Stage-2 candidates by the author's "zoom and confirm" rule, from the runs the Stage-1 tables use: per width
the best (R, P) and its grid neighbours along each axis (past an edge the last step repeats), and
`stage.sentinels=K` ranked just below; a width whose runs mix recipes is refused in one line."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from cart_sweeps.config import RECIPE_KEYS, ConfigError
from cart_sweeps.metric import require
from cart_sweeps.rules.axes import D, P, R
from cart_sweeps.rules.decide import best_per, ranked
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
    """The (R, P) promoted from one width's configurations, best first: the best and its neighbours on each axis."""
    best_r, best_p = order[0]
    points = {(best_r, best_p)}
    points |= {(r, best_p) for r in neighbours([r for r, _ in order], best_r, _LOWEST[R])}
    points |= {(best_r, p) for p in neighbours([p for _, p in order], best_p, _LOWEST[P])}
    return sorted(points)


def sentinels(order: list[tuple[int, int]], k: int) -> list[tuple[int, int]]:
    """The `k` configurations ranked just below the cutoff: the best-ranked ones the rule does not promote."""
    cut = set(promoted(order))
    return [c for c in order if c not in cut][:k]


def ranking(scored: list[tuple[float, dict[str, Any]]], metric: str) -> list[tuple[int, int]]:
    """One width's (R, P) configurations best first (decide.ranked)."""
    values: dict[tuple[int, int], list[float]] = defaultdict(list)
    for value, params in scored:
        values[(params[R], params[P])].append(value)
    return [r.option for r in ranked(values, require(metric))]


def zoom_candidates(runs: RunSet, metric: str, widths: list[int], k: int = 0) -> list[dict[str, Any]]:
    """The (d, R, P) points to confirm per width in `widths`, with `k` sentinels (stage.sentinels) each."""
    by_width: dict[int, list[tuple[float, dict[str, Any], StageRun]]] = defaultdict(list)
    for value, params, run in _scored(runs, metric, ZOOM_AXES):
        by_width[params[D]].append((value, params, run))
    out = []
    for d in widths:
        if not by_width.get(d):
            raise ConfigError(f"stage.select=zoom: stage {runs.stage} has no completed run with {metric} at d={d}")
        _one_recipe(runs, d, [run for _, _, run in by_width[d]], "zoom")
        order = ranking([(value, params) for value, params, _ in by_width[d]], metric)
        out += [{D: d, R: r, P: p} for r, p in sorted([*promoted(order), *sentinels(order, k)])]
    return out
