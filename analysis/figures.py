"""The study's figures as PNG, drawn on matplotlib Figure objects (Agg canvas; no pyplot, no display)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.load import AnalysisError, Study
from analysis.stats import recipe_of, wd_only_rho
from analysis.tables import stage1_cells


def _panels(widths: list, ylabel: str) -> tuple[Figure, list[Axes]]:
    """One panel per width, side by side."""
    fig = Figure(figsize=(3.4 * len(widths), 3.2))
    axes = fig.subplots(1, len(widths), squeeze=False)
    for ax, d in zip(axes[0], widths, strict=True):
        ax.set_title(f"d={d}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    return fig, list(axes[0])


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def stage1_ppl_vs_r(study: Study, metric: str, path: Path) -> None:
    """Stage-1 metric against R, one panel per width, one line per P (the paper's P-vs-R picture)."""
    cells = stage1_cells(study.final(), metric, "stage1_ppl_vs_R")
    widths = sorted(cells["d"].unique())
    fig, axes = _panels(widths, metric)
    for ax, d in zip(axes, widths, strict=True):
        for p, g in cells[cells["d"] == d].sort_values("R").groupby("P"):
            ax.plot(g["R"], g[metric], marker="o", label=f"P={p}")
        ax.set_xlabel("R (loops)")
    axes[-1].legend(fontsize=8)
    _save(fig, path)


def curves(study: Study, stage: str, column: str, path: Path) -> None:
    """A training-log column (loss, rho) against step for every run of a stage, one panel per width.

    For rho, each run's recipe also draws the curve weight decay alone would give (dashed).
    """
    log = study.train
    if log.empty or column not in log:
        raise AnalysisError(f"figure of {column} needs training logs (metrics.jsonl in run folders)")
    rows = log[(log["stage"] == stage) & log[column].notna()]
    if column == "rho":
        rows = rows[rows["model"] == "cart"]
    if rows.empty:
        raise AnalysisError(f"figure of {column} needs logged {column} in stage {stage}")
    widths = sorted(rows["d_model"].unique())
    fig, axes = _panels(widths, column)
    for ax, d in zip(axes, widths, strict=True):
        recipes = set()
        runs = rows[rows["d_model"] == d].sort_values("step").groupby("label")
        for label, run in runs:  # a legend of more than a dozen runs hides the plot
            ax.plot(run["step"], run[column], lw=1, label=str(label) if runs.ngroups <= 12 else None)
            recipes.add(recipe_of(run.iloc[-1]))
        if column == "rho":
            for recipe in sorted(recipes, key=lambda r: r.steps):
                ax.plot(wd_only_rho(recipe), "k--", lw=1, label=f"weight decay only ({recipe.steps} steps)")
        ax.set_xlabel("step")
        ax.legend(fontsize=6)
    _save(fig, path)


def figure_jobs(study: Study, metric: str) -> dict[str, Callable[[Path], None]]:
    """Every figure the study's inputs could give, by name; each job takes the PNG path."""
    jobs: dict[str, Callable[[Path], None]] = {"stage1_ppl_vs_R": partial(stage1_ppl_vs_r, study, metric)}
    stages = sorted(study.train["stage"].unique()) if not study.train.empty else []
    for stage in stages:
        for column in ("loss", "rho"):
            name = f"stage{stage}" if stage.isdigit() else stage
            jobs[f"{column}_{name}"] = partial(curves, study, stage, column)
    return jobs
