"""Fronts: what no configuration beats on every count at once (docs/decisions.md describes both).

- `pareto_<stage>` (and `_plot`), for a stage of several objectives (`sweep.metrics`, its StageRecord).
- `stage1_compute_front` (and `_plot`), a paper table: per width, the Stage-1 cells no cheaper or equally costly
  cell beats, costed by cart_sweeps.model's formula from each run's record, or for a results CSV (which records
  neither model nor sequence length) at the paper's screen recipe.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from cart_sweeps.config import ModelConfig
from cart_sweeps.metric import require as require_metric
from cart_sweeps.model.params import train_flops_per_token

from . import tables
from .figures import FigureJob, metric_label, save
from .load import FLOPS, AnalysisError, Study, rank_values
from .stage_tables import column_name
from .stages import SCREEN

PREFIX = "pareto_"  # pareto_<stage>
PLOT = "_plot"  # a figure's name: its table's and this
COMPUTE = "stage1_compute_front"


def stages(study: Study) -> list[str]:
    """The stages of several objectives."""
    return sorted(s for s, axes in study.axes.items() if len(axes.metrics) > 1)


def stage_of(name: str) -> str | None:
    """The stage a Pareto table or figure is of (None: not one)."""
    return name.removeprefix(PREFIX).removesuffix(PLOT) if name.startswith(PREFIX) else None


def non_dominated(values: pd.DataFrame, signs: list[int]) -> np.ndarray:
    """Which rows no other row dominates; `signs[i]` orients column i so that lower is better (Metric.sign)."""
    oriented = values.to_numpy(float) * np.asarray(signs, float)
    no_worse = (oriented[:, None, :] <= oriented[None, :, :]).all(axis=2)  # [j, i]: j no worse than i anywhere
    better = (oriented[:, None, :] < oriented[None, :, :]).any(axis=2)
    return ~(no_worse & better).any(axis=0)


def _configurations(study: Study, stage: str) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Per configuration of the stage (its axes less the seed), each objective's seed mean and the seeds;
    (table, key columns, objectives)."""
    axes = study.axes[stage]
    objectives = list(axes.metrics)
    final = study.final()
    rows = final[final["stage"] == stage]
    absent = [m for m in objectives if m not in rows]
    if absent or rows.empty:
        raise AnalysisError(f"stage {stage} has no completed runs with {', '.join(absent or objectives)}")
    rows = rows.dropna(subset=objectives)
    keys = [c for c in axes.columns if c != "seed" and c in rows]
    if not keys:
        rows, keys = rows.assign(config="all"), ["config"]
    grouped = rows.groupby(keys, dropna=False, sort=False)
    configs = grouped[objectives].mean().join(grouped.size().rename("seeds")).reset_index()
    if configs.empty:
        raise AnalysisError(f"stage {stage} has no run that measured all of {', '.join(objectives)}")
    return configs, keys, objectives


def pareto_table(study: Study, stage: str) -> pd.DataFrame:
    """The stage's non-dominated configurations, each objective's mean and rank, best first by the first."""
    configs, keys, objectives = _configurations(study, stage)
    for m in objectives:
        configs[f"{m}_rank"] = rank_values(configs[m], m).rank(method="min").astype(int)
    front = configs[non_dominated(configs[objectives], [require_metric(m).sign for m in objectives])]
    front = front.loc[rank_values(front[objectives[0]], objectives[0]).sort_values(kind="stable").index]
    ordered = [*keys, *(c for m in objectives for c in (m, f"{m}_rank")), "seeds"]
    return front[ordered].rename(columns={k: column_name(k) for k in keys}).reset_index(drop=True)


def _label(row: pd.Series, keys: list[str]) -> str:
    """`R=2 lr=0.001`: a whole number as one (a column with gaps holds floats)."""
    return " ".join(
        f"{column_name(k)}={row[k]:g}" if isinstance(row[k], float) else f"{column_name(k)}={row[k]}" for k in keys
    )


def pareto_figure(study: Study, stage: str) -> Figure:
    """Objective 1 (x) against objective 2 (y): every configuration, the front joined and each point named."""
    configs, keys, objectives = _configurations(study, stage)
    x, y = objectives[:2]
    mask = non_dominated(configs[[x, y]], [require_metric(m).sign for m in (x, y)])
    front = configs[mask].sort_values(x)
    fig = Figure(figsize=(5.2, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.plot(configs[x], configs[y], "o", color="0.6", label="configuration (seed mean)")
    ax.plot(front[x], front[y], "o-", color="C1", label=f"Pareto front of {x} and {y}")
    for _, row in front.iterrows():
        ax.annotate(_label(row, keys), (row[x], row[y]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel(metric_label(x))
    ax.set_ylabel(metric_label(y))
    ax.grid(alpha=0.3)
    fig.suptitle(f"Stage {stage}: {x} against {y}" + (f" ({len(objectives)} objectives)" * (len(objectives) > 2)))
    return fig


def table_jobs(study: Study) -> dict[str, Callable[[], pd.DataFrame]]:
    """Every Pareto table the study's stages give, by name."""
    return {f"{PREFIX}{stage}": partial(pareto_table, study, stage) for stage in stages(study)}


def figure_jobs(study: Study, metric: str) -> dict[str, FigureJob]:
    """The Pareto figures, and the compute front's where the study has a screen stage's runs."""
    jobs: dict[str, FigureJob] = {
        f"{PREFIX}{stage}{PLOT}": partial(save, partial(pareto_figure, study, stage)) for stage in stages(study)
    }
    if not tables.select(study.final(), (SCREEN,)).empty:
        jobs[f"{COMPUTE}{PLOT}"] = partial(save, partial(compute_figure, study, metric))
    return jobs


# A results CSV records d, P and R only: its Stage-1 cells are costed at the paper's screen recipe, the shipped
# screen stage's at scale=paper (conf/model/cart.yaml's head size, paper_mix's vocabulary, sweeps/1.yaml's sequence
# length; tests/test_pareto.py composes that stage and checks these against it, so the analysis composes nothing).
PAPER_SCREEN_MODEL = ModelConfig(name="cart", d_model=1024, head_dim=64, vocab_size=32000, max_seq_len=1024)
PAPER_SCREEN_SEQ_LEN = 512


def _with_flops(rows: pd.DataFrame) -> pd.DataFrame:
    """Each run's training GFLOPs per token: as loaded from what its run records (analysis.load), else (a results
    CSV records only d, P, R) at the screen stage's recipe, costed once per cell (a CSV may hold a million rows)."""
    given = rows[FLOPS].astype(float) if FLOPS in rows else pd.Series(np.nan, index=rows.index)
    if (missing := given.isna()).any():
        cells = list(rows.loc[missing, tables.CONFIG].astype(int).itertuples(index=False, name=None))
        given = given.copy()
        given[missing] = [_screen_gflops(cell) for cell in cells]
    return rows.assign(**{FLOPS: given})


@functools.cache
def _screen_gflops(cell: tuple[int, ...]) -> float:
    d_model, n_prelude, n_loops = cell  # tables.CONFIG's order
    model = replace(PAPER_SCREEN_MODEL, d_model=d_model, n_prelude=n_prelude, n_loops=n_loops)
    return train_flops_per_token(model, PAPER_SCREEN_SEQ_LEN) / 1e9


def compute_cells(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per Stage-1 cell (d, P, R): the metric's seed mean, the seeds, the training GFLOPs per token, and
    whether it is on its width's front (no cell of the width as cheap or cheaper is as good and better in one)."""
    rows = tables.rows_of(final, (SCREEN,), COMPUTE)
    tables.require(rows, [*tables.CONFIG, metric], COMPUTE)
    rows = rows.dropna(subset=[metric])
    rows = _with_flops(rows)
    grouped = rows.groupby(tables.CONFIG)
    cells = grouped[metric].mean().to_frame().join(grouped.size().rename("seeds")).join(grouped[FLOPS].first())
    cells = cells.reset_index().rename(columns=tables.SHORT)
    signs = [require_metric(metric).sign, 1]  # FLOPs: fewer is better
    cells["front"] = False
    for _, width in cells.groupby("d"):
        cells.loc[width.index, "front"] = non_dominated(width[[metric, FLOPS]], signs)
    return cells


def stage1_compute_front(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per width, its front: the cells worth their compute, cheapest first."""
    cells = compute_cells(final, metric)
    front = cells[cells["front"]].sort_values(["d", FLOPS], kind="stable")
    return front[["d", "P", "R", FLOPS, metric, "seeds"]].reset_index(drop=True)


def compute_figure(study: Study, metric: str) -> Figure:
    """The metric against FLOPs per token: each width's cells, and its front joined, each front cell named."""
    cells = compute_cells(study.final(), metric)
    fig = Figure(figsize=(6.0, 4.2), layout="constrained")
    ax = fig.subplots()
    for i, (d, width) in enumerate(cells.groupby("d")):
        front = width[width["front"]].sort_values(FLOPS)
        ax.plot(width[FLOPS], width[metric], "o", color=f"C{i}", alpha=0.35)
        ax.plot(front[FLOPS], front[metric], "o-", color=f"C{i}", label=f"d = {d}: front")
        for j, (_, row) in enumerate(front.iterrows()):  # labels above and below in turn: neighbours stay apart
            ax.annotate(
                f"P{row['P']} R{row['R']}",
                (row[FLOPS], row[metric]),
                xytext=(0, 5 if j % 2 == 0 else -5),
                ha="center",
                va="bottom" if j % 2 == 0 else "top",
                fontsize=6,
                textcoords="offset points",
            )
    ax.plot([], [], "o", color="0.5", alpha=0.35, label="cell off the front")
    ax.set_xscale("log")
    ax.set_xlabel("training GFLOPs per token (forward + backward)")
    ax.set_ylabel(metric_label(metric))
    ax.grid(alpha=0.3)
    fig.suptitle("Stage 1: quality against compute, the front per width")
    return fig
