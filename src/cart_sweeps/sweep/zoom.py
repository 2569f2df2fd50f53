"""Stage-2 candidates by the author's "zoom and confirm" rule, from the Stage-1 runs its conclusions use
(cart_sweeps.sweep.runset: the same runs the analysis tables).

Per width: the best R and the best P of Stage 1 (the best sweep metric at the end, in its direction), each with its grid
neighbour on either side; past the grid's edge the last step is repeated (best R=8 of {2,4,6,8} adds
R=10). The candidates are the best (R, P) and its neighbours along each axis (a cross, not a square).
A configuration run with several seeds (a screen's replicates) ranks by its mean. `stage.sentinels=K` also
promotes the K configurations ranked just below that cutoff, so the analysis can tell whether the cutoff would
have missed Stage 2's winner.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from cart_sweeps.config import ConfigError
from cart_sweeps.metric import require
from cart_sweeps.sweep.runset import RunSet

D, R, P = "model.d_model", "model.n_loops", "model.n_prelude"
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


def _scored(runs: RunSet, metric: str, keys: tuple[str, ...]) -> list[tuple[float, dict[str, Any], str]]:
    """(rank value, grid point in the paper's numbers, run folder) of each run the source's conclusions use; the
    rank value is the metric oriented so that lower is better (cart_sweeps.metric: an accuracy is negated)."""
    sign, out = require(metric).sign, []
    for run in runs.used:
        value = run.summary.value(metric) if run.summary else None
        if value is not None and all(k in run.params for k in keys):
            out.append((sign * value, run.params, str(run.folder)))
    return out


def best_single_run(runs: RunSet, metric: str) -> dict[int, dict[str, Any]]:
    """The stage selection's "best": per width (paper number), the one run of the source stage with the best
    `metric` among those its conclusions use, its R and folder (what the benchmarks stage evaluates, as the
    paper's zero-shot table does at each scale's best R). A single run, since one checkpoint is evaluated;
    the tables' "best" is the best seed mean (analysis.tables.best_seed_mean)."""
    best: dict[int, tuple[float, dict[str, Any]]] = {}
    for value, params, folder in _scored(runs, metric, (D, R)):
        if params[D] not in best or value < best[params[D]][0]:
            best[params[D]] = (value, {R: params[R], "run_dir": folder})
    if not best:
        raise ConfigError(f"stage.select=best: stage {runs.stage} has no completed run with {metric}")
    return {d: best[d][1] for d in sorted(best)}


def promoted(ranked: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (R, P) the rule promotes from one width's configurations ranked best first: the best and its
    grid neighbours along each axis."""
    best_r, best_p = ranked[0]
    points = {(best_r, best_p)}
    points |= {(r, best_p) for r in neighbours([r for r, _ in ranked], best_r, _LOWEST[R])}
    points |= {(best_r, p) for p in neighbours([p for _, p in ranked], best_p, _LOWEST[P])}
    return sorted(points)


def sentinels(ranked: list[tuple[int, int]], k: int) -> list[tuple[int, int]]:
    """The `k` configurations ranked just below the cutoff: the best-ranked ones the rule does not promote."""
    cut = set(promoted(ranked))
    return [c for c in ranked if c not in cut][:k]


def ranking(scored: list[tuple[float, dict[str, Any]]]) -> list[tuple[int, int]]:
    """One width's (R, P) configurations, best (lowest mean rank value over their runs) first."""
    values: dict[tuple[int, int], list[float]] = defaultdict(list)
    for value, params in scored:
        values[(params[R], params[P])].append(value)
    return sorted(values, key=lambda c: sum(values[c]) / len(values[c]))


def zoom_candidates(runs: RunSet, metric: str, widths: list[int], k: int = 0) -> list[dict[str, Any]]:
    """The (d, R, P) points to confirm, for each width in `widths`, from the runs the source's conclusions
    use; `k` sentinels per width (stage.sentinels) beside them."""
    by_width: dict[int, list[tuple[float, dict[str, Any]]]] = defaultdict(list)
    for value, params, _ in _scored(runs, metric, ZOOM_AXES):
        by_width[params[D]].append((value, params))
    out = []
    for d in widths:
        if not by_width.get(d):
            raise ConfigError(f"stage.select=zoom: stage {runs.stage} has no completed run with {metric} at d={d}")
        ranked = ranking(by_width[d])
        out += [{D: d, R: r, P: p} for r, p in sorted([*promoted(ranked), *sentinels(ranked, k)])]
    return out
