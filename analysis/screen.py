"""How reliable is a screen? The paper's 3,000-step screen ranks R one way and 30,500-step training the other:
when does a stage's ranking (per width, of seed means) settle into its final order, and does Stage 1's carry?"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from .load import CELL, AnalysisError, rank_values, require
from .stages import CONFIRM, SCREEN

KEY = [c for c in CELL if c != "d_model"]  # what a ranking within one width ranks
MIN_RANKED = 3  # fewer configurations make Kendall's tau and Spearman's rho +-1 by construction


def _configs(rows: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, list[str]]:
    """Metric per (d, config, step), averaged over seeds and oriented so that lower ranks first, and the config
    keys (a missing key reads "-", so configs align across steps and stages: NaN never equals NaN in an index)."""
    keys = [k for k in KEY if k in rows]
    rows = rows.assign(**{k: rows[k].astype(object).where(rows[k].notna(), "-") for k in keys})
    rows = rows.assign(**{metric: rank_values(rows[metric], metric)})
    return rows.groupby(["d_model", *keys, "step"])[metric].mean().reset_index(), keys


def agreement(at: pd.Series, final: pd.Series) -> dict[str, float | int | bool | None]:
    """Kendall tau, Spearman rho, whether the best (lowest rank value) and the whole order are the same, over
    the configs both rank."""
    both = pd.concat([at.rename("at"), final.rename("final")], axis=1).dropna()
    n = len(both)
    if n < 2:
        return {"n": n, "kendall_tau": None, "spearman": None, "top1_agrees": None, "same_order": None}
    corr = n >= MIN_RANKED and both["at"].nunique() > 1 and both["final"].nunique() > 1
    return {
        "n": n,
        "kendall_tau": float(stats.kendalltau(both["at"], both["final"]).statistic) if corr else None,
        "spearman": float(stats.spearmanr(both["at"], both["final"]).statistic) if corr else None,
        "top1_agrees": bool(both["at"].idxmin() == both["final"].idxmin()),
        "same_order": bool((both["at"].rank() == both["final"].rank()).all()),
    }


def _final_step(cells: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Each config's metric at its last evaluated step."""
    last = cells.sort_values("step").groupby(["d_model", *keys]).tail(1)
    return last.set_index(["d_model", *keys])


def screen_agreement(evals: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per stage, width and evaluation step: agreement of that step's ranking with the final ranking."""
    require(evals, ["stage", "d_model", "step", metric], "screen_agreement")
    out = []
    for stage, rows in evals.dropna(subset=[metric, "step"]).groupby("stage", sort=True):
        cells, keys = _configs(rows, metric)
        final = _final_step(cells, keys)
        for (d, step), at in cells.groupby(["d_model", "step"], sort=True):
            end = final.loc[d]
            if (end["step"] < step).all():
                continue
            ranked = at.set_index(keys)[metric]
            out.append(
                {
                    "stage": stage,
                    "d": d,
                    "step": step,
                    "final_step": int(end["step"].max()),
                    **agreement(ranked, end[metric]),
                }
            )
    table = pd.DataFrame(out)
    if table.empty or not (table["step"] < table["final_step"]).any():
        raise AnalysisError(
            "table 'screen_agreement' needs runs that logged evaluations before their last step; the input has "
            "each run's final evaluation only"
        )
    return table


def screen_transfer(evals: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Stage 1's final ranking against Stage 2's at the step Stage 1 ended (or the last before) and at the end."""
    require(evals, ["stage", "d_model", "step", metric], "screen_transfer")
    rows = evals.dropna(subset=[metric, "step"])
    one, keys = _configs(rows[rows["role"] == SCREEN], metric)
    two, _ = _configs(rows[rows["role"] == CONFIRM], metric)
    if one.empty or two.empty:
        raise AnalysisError("table 'screen_transfer' needs runs of stage 1 and stage 2; the input lacks one")
    screen = _final_step(one, keys)
    out = []
    for d, end in screen.groupby(level=0):
        stage2 = two[two["d_model"] == d]
        if stage2.empty:
            continue
        screen_step = int(end["step"].max())
        earlier = stage2[stage2["step"] <= screen_step]
        points = {"end": _final_step(stage2, keys).loc[d]}
        if not earlier.empty:
            points["matching"] = _final_step(earlier, keys).loc[d]
        for when, at in points.items():
            out.append(
                {
                    "d": d,
                    "stage1_step": screen_step,
                    "stage2_point": when,
                    "stage2_step": int(at["step"].max()),
                    **agreement(end.droplevel(0)[metric], at[metric]),
                }
            )
    if not out:
        raise AnalysisError("table 'screen_transfer' needs a width trained in both stage 1 and stage 2")
    return pd.DataFrame(out).sort_values(["d", "stage2_step"]).reset_index(drop=True)


def shortest_screen(table: pd.DataFrame) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """Per stage and width: the first step from which every evaluation agrees with the final ranking,
    by the top-1 pick and by the whole order; None when only the final step does."""
    out: dict[str, dict[str, dict[str, float | int | None]]] = {}
    for (stage, d), rows in table.groupby(["stage", "d"], sort=True):
        rows = rows.sort_values("step")
        final_step = int(rows["final_step"].max())
        early = rows[rows["step"] < final_step]
        found: dict[str, float | int | None] = {"final_step": final_step, "evaluations": len(early)}
        for name, column in (("top1", "top1_agrees"), ("full_order", "same_order")):
            agrees = early[column].fillna(False).astype(bool)
            settled = _settled_from(early["step"].to_numpy(), agrees.to_numpy(bool))
            found[f"{name}_step"] = settled
            found[f"{name}_fraction"] = None if settled is None else round(settled / final_step, 4)
        out.setdefault(str(stage), {})[str(d)] = found
    return out


def _settled_from(steps: np.ndarray, agrees: np.ndarray) -> int | None:
    """The first step after which `agrees` holds at every later step (None if it fails at the last one)."""
    if not len(steps) or not agrees[-1]:
        return None
    failing = np.flatnonzero(~agrees)
    return int(steps[failing[-1] + 1] if len(failing) else steps[0])
