"""Each stage's own table, with or without a paper role: per cell (its axes less the seed) the seed mean of its
ranking metric (its sweep metric where recorded), the spread where seeds vary, its other validation sets; best
first. A search is tabled trial by trial, so its first row is the ledger's best trial.
"""

from __future__ import annotations

import pandas as pd

from cart_sweeps.metric import metric as metric_of

from . import tables
from .decisions import and_
from .errors import AnalysisError
from .load import ASKED, PAPERS, StageAxes, Study, ppl_sets, rank_values

PREFIX = "runs_"  # runs_<stage>
SHORT = {f"{prefix}{key}": short for key, short in tables.SHORT.items() for prefix in ("model.", "")}  # runs, a CSV


def column_name(key: str) -> str:
    """A table's name for an axis: d, P, R, L for the paper's, else the key's last part (lr, gate_init)."""
    return SHORT.get(key, key.rsplit(".", 1)[-1])


def names(study: Study) -> list[str]:
    return [f"{PREFIX}{stage}" for stage in sorted(study.axes)]


def stage_of(name: str) -> str:
    return name.removeprefix(PREFIX)


def stage_metric(rows: pd.DataFrame, axes: StageAxes, metric: str) -> str:
    """The stage's own sweep metric where its runs hold it, else the ranking metric."""
    own = axes.metric
    return own if own is not None and own in rows and rows[own].notna().any() else metric


def ranking_line(study: Study, final: pd.DataFrame, metric: str, why: str) -> str | None:
    """'Ranking metric: ...' where a reader could assume another, each with its one reason: --metric's for every
    table, over the stages' own sweep.metric it overrides (report.build); else each stage's own table by its
    sweep.metric where it records one, every other table by the analysis's (the paper's, or a fallback), in one
    clause where the two are one metric; nothing where every table ranks by --metric's or the paper's."""
    own: dict[str, list[str]] = {}  # a sweep.metric -> the stages whose own table ranks by it
    for stage, axes in sorted(study.axes.items()):
        if (m := stage_metric(final[final["stage"] == stage], axes, metric)) == axes.metric:
            own.setdefault(m, []).append(stage)
    if why == ASKED:
        over = "; ".join(f"{_stages(stages)}'s sweep.metric {m}" for m, stages in own.items() if m != metric)
        return f"Ranking metric: {metric} for every table, {why} (over {over})." if over else None
    if not own or (why == PAPERS and set(own) == {metric}):
        return None if why == PAPERS else f"Ranking metric: {metric}, {why}."
    if set(own) == {metric}:  # one metric: one clause, each table's reason in it
        stages, whose = own[metric], "its" if len(own[metric]) == 1 else "their"
        return f"Ranking metric: {metric} for every table: {_stages(stages)} by {whose} sweep.metric, the others {why}."
    said = [f"{m} for {_stages(stages)}" for m, stages in own.items()]
    reason = f" ({why})" if why == PAPERS else f", {why}"
    own_tables = f"{'; '.join(said)} (a stage's own table: its sweep.metric)"
    return f"Ranking metric: {own_tables}; {metric} for every other table{reason}."


def _stages(names: list[str]) -> str:
    """'stage 1', 'stages 1, 2 and 3'."""
    return f"stage{'s' * (len(names) > 1)} {and_(names)}"


def stage_table(final: pd.DataFrame, stage: str, axes: StageAxes, metric: str) -> pd.DataFrame:
    """The stage's cells (or trials), best first, with every axis value it varies."""
    rows = final[final["stage"] == stage]
    if rows.empty:
        raise AnalysisError(f"stage {stage} has no completed runs to table")
    metric = stage_metric(rows, axes, metric)
    others = [m for m in ppl_sets(rows) if m != metric]
    keys = [c for c in axes.columns if c != "seed" and c in rows]
    if axes.search:
        keys = ["trial", *keys] if "trial" in rows else keys
        table = rows[[*keys, metric, *others]]
        table = table.loc[rank_values(table[metric], metric).sort_values(kind="stable").index]
        return table.rename(columns={k: column_name(k) for k in keys}).reset_index(drop=True)
    if not keys:  # one configuration (its seeds, if any)
        rows = rows.assign(config="all")
        keys = ["config"]
    grouped = rows.groupby(keys, dropna=False, sort=False)
    table = (
        grouped[metric]
        .agg(["mean", "std", "count"])
        .rename(columns={"mean": metric, "std": f"{metric}_std", "count": "seeds"})
    )
    if "seed" not in axes.columns or table["seeds"].max() < 2:
        table = table.drop(columns=[f"{metric}_std"])
    table = table.join(grouped[others].mean()) if others else table
    table = table.reset_index()
    table = table.loc[rank_values(table[metric], metric).sort_values(kind="stable").index].reset_index(drop=True)
    return table.rename(columns={k: column_name(k) for k in keys})


def mean_note(table: pd.DataFrame) -> str | None:
    """Which mean a seeded log-scale column shows, beside the sentences' % (of geometric means: the tested scale)."""
    logged = [
        c.removesuffix("_std") for c in table if c.endswith("_std") and (m := metric_of(c[:-4])) and m.kind.log_scale
    ]
    if not logged:
        return None
    return (
        f"{and_(logged)}: the seeds' arithmetic mean; the decisions' % compare geometric means, on the log scale "
        "they test (docs/statistics.md)"
    )


def best_rows(tables: dict[str, pd.DataFrame]) -> dict[str, dict[str, object]]:
    """Per stage, its best cell (or trial): the first row of its own table."""
    return {stage_of(name): table.head(1).to_dict("records")[0] for name, table in tables.items() if not table.empty}
