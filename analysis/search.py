"""A search stage in one picture: its metric against trial number (with the best so far), and against each
parameter it searches (a categorical one at its choices; a parameter a trial's condition left out is not drawn
for that trial)."""

from __future__ import annotations

from functools import partial

import pandas as pd
from matplotlib.figure import Figure

from .figures import FigureJob, metric_label, save
from .load import AnalysisError, Study, rank_values
from .stage_tables import column_name, stage_metric

PREFIX = "search_"  # search_<stage>


def search_figure(study: Study, stage: str, metric: str) -> Figure:
    """Panel 1: each trial's metric by trial number and the best so far; then one panel per parameter."""
    axes_ = study.axes[stage]
    final = study.final()
    rows = final[(final["stage"] == stage) & final["trial"].notna()].sort_values("trial")
    metric = stage_metric(rows, axes_, metric)
    rows = rows[rows[metric].notna()]
    params = [c for c in axes_.columns if c != "seed" and c in rows and rows[c].notna().any()]
    if rows.empty or not params:
        raise AnalysisError(f"figure of search {stage} needs completed trials with {metric}")
    fig = Figure(figsize=(3.4 * (1 + len(params)), 3.4), layout="constrained")
    panels = fig.subplots(1, 1 + len(params), squeeze=False, sharey=True)[0]
    ranked = rank_values(rows[metric], metric)
    best_so_far = rows[metric].where(ranked == ranked.cummin()).ffill()
    panels[0].plot(rows["trial"], rows[metric], "o", color="C0", label="trial")
    panels[0].step(rows["trial"], best_so_far, where="post", color="C1", label="best so far")
    panels[0].set_xlabel("trial number")
    panels[0].set_ylabel(metric_label(metric))
    for ax, param in zip(panels[1:], params, strict=True):
        held = rows[rows[param].notna()]
        values = pd.to_numeric(held[param], errors="coerce")
        if values.isna().any():  # categorical: its choices along the axis, in first-seen order
            choices = list(dict.fromkeys(held[param].astype(str)))
            ax.set_xticks(range(len(choices)), choices)
            values = held[param].astype(str).map({c: i for i, c in enumerate(choices)})
        elif values.min() > 0 and values.max() / values.min() >= 20:  # a range spanning decades: a log axis
            ax.set_xscale("log")
        ax.plot(values, held[metric], "o", color="C0")
        ax.set_xlabel(column_name(param))
    for ax in panels:
        ax.grid(alpha=0.3)
    fig.suptitle(f"Search {stage}: {metric} by trial and by parameter")
    return fig


def search_jobs(study: Study, metric: str) -> dict[str, FigureJob]:
    """One figure per search stage (`search_<stage>`)."""
    return {
        f"{PREFIX}{stage}": partial(save, partial(search_figure, study, stage, metric))
        for stage, axes_ in sorted(study.axes.items())
        if axes_.search
    }
