"""The promotion audit (docs/statistics.md): would the zoom's rule (cart_sweeps.rules.zoom.screens, the zoom
stage's own) have missed the configuration Stage 2 confirms, and how well do the two stages' rankings agree, pair
by pair, with a bootstrap interval over each configuration's seeds (a one-seed configuration stays fixed)?
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from cart_sweeps.metric import require as require_metric
from cart_sweeps.rules.axes import STEPS
from cart_sweeps.rules.decide import ranked
from cart_sweeps.rules.zoom import drift_allowance, screens

from .load import ZOOM_ALLOWANCE, AnalysisError, last_steps, paper_number, rank_values
from .stages import CONFIRM, SCREEN
from .tables import select

RESAMPLES = 2000
LEVEL = 0.95


def _values(rows: pd.DataFrame, metric: str) -> dict[tuple[int, int], np.ndarray]:
    """(R, P) -> the metric of each of its runs, oriented so that lower ranks first."""
    rows = rows.dropna(subset=[metric])
    rows = rows.assign(ranked=rank_values(rows[metric], metric))
    return {
        (int(r), int(p)): group["ranked"].to_numpy(float) for (r, p), group in rows.groupby(["n_loops", "n_prelude"])
    }


def _screened(rows: pd.DataFrame, metric: str) -> dict[tuple[int, int], list[float]]:
    """(R, P) -> the metric of each of its screen runs, as the zoom reads them."""
    rows = rows.dropna(subset=[metric])
    return {(int(r), int(p)): group[metric].tolist() for (r, p), group in rows.groupby(["n_loops", "n_prelude"])}


def _allowance(one: pd.DataFrame, two: pd.DataFrame) -> tuple[float, bool]:
    """The drift allowance the zoom is given, and whether Stage 2 zoomed: its record's (load.ZOOM_ALLOWANCE), else
    the zoom's own from the two stages' horizons in paper steps at the drift prior, as the zoom stage takes them."""
    recorded = two[ZOOM_ALLOWANCE].dropna() if ZOOM_ALLOWANCE in two else pd.Series(dtype=float)
    if len(recorded):
        return float(recorded.iloc[0]), True
    return drift_allowance(*(_paper_steps(rows) for rows in (one, two))), False


def _paper_steps(rows: pd.DataFrame) -> int:
    """A stage's horizon in paper steps: its longest run's (load.paper_number)."""
    if "step" not in rows:
        return 1
    last = rows.loc[rows["step"].idxmax()]
    return paper_number(last["run_dir"], STEPS, int(last["step"])) if "run_dir" in rows else int(last["step"])


def _order(values: dict[tuple[int, int], np.ndarray], metric: str) -> list[tuple[int, int]]:
    """The configurations best first by the study's one rule, from their oriented values (`_values`)."""
    record = require_metric(metric)
    return [r.option for r in ranked({c: (record.sign * v).tolist() for c, v in values.items()}, record)]


def _concordance(one: np.ndarray, two: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    """Share of `pairs` ordered alike by the means `one` and `two` ([..., config]); a tie counts half."""
    i, j = (np.array(side) for side in zip(*pairs, strict=True))
    product = np.sign(one[..., i] - one[..., j]) * np.sign(two[..., i] - two[..., j])
    return np.where(product == 0, 0.5, product > 0).mean(axis=-1)


def _resampled(values: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """[resample, config]: each configuration's mean over its seeds drawn with replacement."""
    return np.stack([v[rng.integers(0, len(v), size=(RESAMPLES, len(v)))].mean(axis=1) for v in values], axis=1)


def agreement(
    screen: dict[tuple, np.ndarray], confirm: dict[tuple, np.ndarray], rng: np.random.Generator
) -> tuple[int, float | None, float | None, float | None]:
    """(pairs, share ordered alike, its bootstrap interval) over the configurations (d, R, P) both stages
    ran, pairing configurations of one width only (pairs across widths would rank widths, not the screen)."""
    shared = sorted(set(screen) & set(confirm))
    pairs = [(i, j) for i, j in combinations(range(len(shared)), 2) if shared[i][0] == shared[j][0]]
    if not pairs:
        return 0, None, None, None
    one, two = ([side[c] for c in shared] for side in (screen, confirm))
    point = float(_concordance(np.array([v.mean() for v in one]), np.array([v.mean() for v in two]), pairs))
    boot = _concordance(_resampled(one, rng), _resampled(two, rng), pairs)
    low, high = np.quantile(boot, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return len(pairs), round(point, 4), round(float(low), 4), round(float(high), 4)


def screen_promotion(evals: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per width both stages trained, and over all widths: the audit of the module's docstring."""
    final = last_steps(evals)
    one, two = (rows.dropna(subset=[metric]) for rows in (select(final, (SCREEN,)), select(final, (CONFIRM,))))
    widths = sorted(set(one["d_model"].dropna()) & set(two["d_model"].dropna()))
    if one.empty or two.empty or not widths:
        raise AnalysisError(f"table 'screen_promotion' needs stage 1 and stage 2 runs with {metric} at a shared width")
    rng = np.random.default_rng(0)  # the same interval each time the analysis runs
    rows: list[dict] = []
    everywhere: tuple[dict, dict] = ({}, {})
    allowance, zoomed = _allowance(one, two)
    found = screens({d: _screened(one[one["d_model"] == d], metric) for d in widths}, metric, allowance)
    for d, screened in zip(widths, found, strict=True):
        screen, confirm = (_values(rows_[rows_["d_model"] == d], metric) for rows_ in (one, two))
        by_d = ({(d, *c): v for c, v in screen.items()}, {(d, *c): v for c, v in confirm.items()})
        order = _order(screen, metric)  # the one rule, as zoom ranks (cart_sweeps.rules.decide.ranked)
        cut = set(screened.cells)
        winner = _order(confirm, metric)[0]  # Stage 2's best, as its table names it (tables.best_cells)
        below = [c for c in confirm if c not in cut]
        pairs, share, low, high = agreement(*by_d, rng)
        for side, values in zip(everywhere, by_d, strict=True):
            side.update(values)
        rows.append(
            {
                "d": d,
                "winner": f"R={winner[0]} P={winner[1]}",
                "winner_screen_rank": order.index(winner) + 1 if winner in screen else None,
                "zoomed": zoomed,
                "promoted": len(cut & set(confirm)),
                "below_cutoff": len(below),
                "cutoff_missed_winner": (winner not in cut) if below and winner in screen else None,
                "pairs": pairs,
                "agreement": share,
                "ci_low": low,
                "ci_high": high,
            }
        )
    pairs, share, low, high = agreement(*everywhere, rng)
    rows.append({"d": "all", "pairs": pairs, "agreement": share, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows)
