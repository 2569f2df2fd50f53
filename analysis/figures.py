"""The study's figures as PDF (for a paper) beside PNG (for report.md), drawn on matplotlib Figure
objects (Agg canvas; no pyplot, no display). Each figure has a title, labelled axes and one legend, below the
panels, its entries in natural order (warm-up 5 before 12); no two of its lines share a colour and a line style,
and matplotlib's constrained layout keeps the title, the panels' labels and the legend apart."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from cart_sweeps.metric import RHO_LABEL
from cart_sweeps.metric import metric as metric_record

from .load import AnalysisError, Study
from .screen import screen_agreement
from .stats import recipe_of, wd_only_rho
from .tables import stage1_cells

FigureJob = Callable[[Path], list[Path]]  # takes the path without suffix, returns the files written
Draw = Callable[[], Figure]
AXIS_LABELS = {"loss": "training loss (nats/token)", "rho": RHO_LABEL}


NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:e[-+]?\d+)?)")  # 12, 0.003, 3e-3 in a label
DASHES = ("-", "--", "-.", ":")
Style = dict[str, Any]  # a line's colour and line style, as Axes.plot takes them


def natural(text: object) -> tuple[tuple[int, float, str], ...]:
    """A sort key reading the numbers in a label as numbers: warmup5 before warmup12, lr=0.003 before lr=0.01."""
    parts = NUMBER.split(str(text))
    return tuple((0, float(part), "") if i % 2 else (1, 0.0, part) for i, part in enumerate(parts))


def styles(keys: Iterable[Hashable]) -> dict[Hashable, Style]:
    """A style per key, in natural order, no two alike: the ten colours solid, then each again in the next
    line style (twenty colours past forty lines; past eighty, a colour scale along the keys' order)."""
    ordered = sorted(dict.fromkeys(keys), key=natural)
    palette = colormaps["tab10" if len(ordered) <= 40 else "tab20"]
    colours = [tuple(c) for c in palette(np.arange(palette.N))]
    pairs = [(colour, dash) for dash in DASHES for colour in colours]
    if len(ordered) > len(pairs):
        pairs = [(tuple(c), "-") for c in colormaps["viridis"](np.linspace(0, 1, len(ordered)))]
    return {key: {"color": colour, "linestyle": dash} for key, (colour, dash) in zip(ordered, pairs, strict=False)}


def metric_label(name: str) -> str:
    """An axis label for a ranking metric, from its record: ppl_wiki -> 'perplexity on wiki (lower is better)'."""
    found = metric_record(name)
    return found.label if found else name


def _panels(widths: list, ylabel: str, title: str, sharey: bool = True) -> tuple[Figure, list[Axes]]:
    """One panel per width, side by side, under one title; `sharey=False` where the widths' scales differ."""
    fig = Figure(figsize=(3.4 * len(widths), 3.4))
    axes = fig.subplots(1, len(widths), squeeze=False, sharey=sharey)
    for ax, d in zip(axes[0], widths, strict=True):
        ax.set_title(f"d = {d}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    return fig, list(axes[0])


def save(draw: Draw, stem: Path) -> list[Path]:
    """`draw`'s figure as PNG and PDF with one legend below the panels (each label once, in natural order), sized
    to hold every artist: a wide legend widens the picture instead of being cut off."""
    fig = draw()
    labelled: dict[str, Artist] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labelled.setdefault(label, handle)
    if not labelled:  # every figure says what its lines are
        raise ValueError(f"figure {stem.name} has no labelled line: give its lines a label")
    fig.set_layout_engine("constrained")
    order = sorted(labelled, key=natural)
    fig.legend([labelled[k] for k in order], order, loc="outside lower center", ncols=min(6, len(order)))
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.1)
    return paths


def stage1_ppl_vs_r(study: Study, metric: str) -> Figure:
    """Stage-1 metric against R, a panel per width (its own y axis: widths differ by factors, R and P by percent),
    a line per P; where seed counts differ (a screen's replicates), a cell of several seeds is ringed."""
    cells = stage1_cells(study.final(), metric, "stage1_ppl_vs_R")
    widths = sorted(cells["d"].unique())
    fig, axes = _panels(widths, metric_label(metric), "Stage 1: the screen's metric at its last step", sharey=False)
    several = cells["seeds"].nunique() > 1  # a screen's replicates beside one-seed cells: marked apart
    style = styles(cells["P"])
    for ax, d in zip(axes, widths, strict=True):
        for p, g in cells[cells["d"] == d].sort_values("R").groupby("P"):
            ax.plot(g["R"], g[metric], marker="o", label=f"P = {p}", **style[p])
            if several:
                for n, at in g[g["seeds"] > 1].groupby("seeds"):
                    ax.plot(at["R"], at[metric], "s", ms=11, mfc="none", color="k", label=f"mean of {n} seeds")
        ax.set_xlabel("R (loop count)")
    return fig


def curves(study: Study, stage: str, column: str) -> Figure:
    """A training-log column (loss, rho) against step for every run of a stage, one panel per width; for rho,
    each recipe's weight-decay-only curve too (dashed)."""
    log = study.train
    if log.empty or column not in log:
        raise AnalysisError(f"figure of {column} needs training logs (metrics.jsonl in run folders)")
    rows = log[(log["stage"] == stage) & log[column].notna()]
    if column == "rho":
        rows = rows[rows["model"] == "cart"]
    if rows.empty:
        raise AnalysisError(f"figure of {column} needs logged {column} in stage {stage}")
    widths = sorted(rows["d_model"].unique())
    fig, axes = _panels(widths, AXIS_LABELS.get(column, column), f"Stage {stage}: {column} during training")
    configs = (_configuration(str(label), d) for label, d in zip(rows["label"], rows["d_model"], strict=True))
    style = styles(configs)  # one style and legend entry per configuration (its seeds alike), across panels
    dashes: dict[int, str] = {}
    for ax, d in zip(axes, widths, strict=True):
        recipes = set()
        runs = rows[rows["d_model"] == d].sort_values("step").groupby("label")
        for label, run in runs:
            config = _configuration(str(label), d)
            ax.plot(run["step"], run[column], lw=1, label=config, **style[config])
            recipes.add(recipe_of(run.iloc[-1]))
        if column == "rho":
            for recipe in sorted(recipes, key=lambda r: (r.steps, repr(r))):  # black, a dash of its own per recipe
                dash = dashes.setdefault(recipe.steps, DASHES[1 + len(dashes) % (len(DASHES) - 1)])
                label = f"weight decay only ({recipe.steps} steps)"
                ax.plot(wd_only_rho(recipe), color="k", linestyle=dash, lw=1, label=label)
        ax.set_xlabel("training step")
    return fig


def _configuration(label: str, d: int) -> str:
    """A run's label less its width, seed and id (d32-P2-R4-s1-3f2a -> P2-R4): what its seeds share."""
    parts = label.replace(f"d{d}-", "", 1).split("-")
    seed = next((i for i, part in enumerate(parts) if part[:1] == "s" and part[1:].isdigit()), len(parts))
    return "-".join(parts[:seed]) or label


def screen_vs_step(study: Study, metric: str) -> Figure:
    """Kendall tau between each evaluation step's ranking and the final one, per stage (panel) and width
    (line); a hollow marker where the top-1 pick differs from the final one."""
    table = screen_agreement(study.evals, metric)
    table = table[table["kendall_tau"].notna()]  # a stage without evaluations before its last has no panel
    stages = sorted(table.groupby("stage").filter(lambda rows: rows["step"].nunique() > 1)["stage"].unique())
    if not stages:
        raise AnalysisError("figure screen_vs_step needs a stage whose runs logged evaluations before their last")
    fig, axes = _panels(stages, "Kendall tau with the final ranking", f"How early the ranking by {metric} settles")
    style = styles(table["d"])
    for ax, stage in zip(axes, stages, strict=True):
        ax.set_title(f"stage {stage}")
        for d, rows in table[table["stage"] == stage].sort_values("step").groupby("d"):
            ax.plot(rows["step"], rows["kendall_tau"].astype(float), label=f"d = {d}", **style[d])
            missed = rows[rows["top1_agrees"] == False]  # noqa: E712 (a column of True/False/None)
            ax.plot(missed["step"], missed["kendall_tau"].astype(float), "o", mfc="none", color=style[d]["color"])
        ax.set_xscale("log")  # evaluations spread from the first hundreds of steps to tens of thousands
        ax.set_xlabel("training step (log scale)")
        ax.set_ylim(-1.05, 1.05)
    axes[0].plot([], [], "ko", mfc="none", label="top-1 pick differs from the final one")
    return fig


def figure_jobs(study: Study, metric: str) -> dict[str, FigureJob]:
    """Every figure the study's inputs could give, by name; each job takes the path without suffix."""
    jobs: dict[str, FigureJob] = {
        "stage1_ppl_vs_R": partial(save, partial(stage1_ppl_vs_r, study, metric)),
        "screen_vs_step": partial(save, partial(screen_vs_step, study, metric)),
    }
    stages = sorted(study.train["stage"].unique()) if not study.train.empty else []
    for stage in stages:
        for column in ("loss", "rho"):
            name = f"stage{stage}" if stage.isdigit() else stage
            jobs[f"{column}_{name}"] = partial(save, partial(curves, study, stage, column))
    return jobs
