"""Any stage's own decision: the best level of each axis it varies, the others held fixed (docs/decisions.md),
by the paper's best-of-k test; the variant, the model and a ladder's rung are held too, never pooled as seeds."""

from __future__ import annotations

from functools import partial
from typing import Any

import pandas as pd

from .decisions import Decision, and_, best, decided_text, not_told, plain, runs, seeds_text, worse_by
from .errors import AnalysisError
from .ladder import STEPS as HORIZON
from .load import VARIANT_AXIS, StageAxes
from .stage_tables import column_name, stage_metric

CLAIM = "best_level"
HELD = ("model", VARIANT_AXIS)  # held fixed wherever they differ among a stage's runs, axes or not
BEST, TIED = "best", "tied"  # a table row's mark: the decided best, or one the data cannot tell from the pick


def decidable(rows: pd.DataFrame, axes: StageAxes) -> list[str]:
    """The axes a stage's decisions may be about: every axis but the seed and a ladder's horizon (a rung, held)
    with at least two levels (a missing value is none), in a stage with a seed axis (a search has no levels)."""
    if axes.search or "seed" not in axes.columns:
        return []
    return [c for c in axes.columns if c not in ("seed", HORIZON) and c in rows and rows[c].nunique() > 1]


def wanted_axes(axes: list[str], asked: list[str] | None) -> list[str]:
    """The stage's axes `asked` names (a key, trainer.lr, or its table column, lr); all without `asked`."""
    if not asked:
        return axes
    return [a for a in axes if a in asked or column_name(a) in asked]


def check_asked(asked: list[str] | None, every: dict[str, list[str]], unread: dict[str, str]) -> None:
    """An axis --decide names that no stage varies (with a seed axis) is one line naming the ones there are, and
    the stages the analysis could not read (`unread`: the axis may be one of theirs)."""
    left = "".join(f"; stage {s} is left out ({why})" for s, why in unread.items())
    for name in asked or []:
        if name in (HORIZON, column_name(HORIZON)):
            raise AnalysisError(
                f"--decide {name}: a ladder's horizon is a rung, not a choice: each rung is decided on its own "
                f"(docs/decisions.md){left}"
            )
        if not any(wanted_axes(axes, [name]) for axes in every.values()):
            have = sorted({a for axes in every.values() for a in axes})
            raise AnalysisError(
                f"--decide {name}: no stage with a seed axis varies it (decidable axes: {', '.join(have) or 'none'})"
                + left
            )


def edge(rows: pd.DataFrame, axis: str, choice: Any) -> str | None:
    """'lr=0.01 is the grid's largest value' where a numeric axis's best lies at its end (no best, none)."""
    levels = pd.to_numeric(rows[axis].dropna().drop_duplicates(), errors="coerce")
    if choice is None or levels.isna().any() or len(levels) < 2 or isinstance(choice, str):
        return None
    end = "largest" if choice == levels.max() else "smallest" if choice == levels.min() else None
    return f"{name(axis, choice)} is the grid's {end} value" if end else None


def name(axis: str, level: Any) -> str:
    """An option as a sentence writes it: lr=0.01, variant=dense; a held axis the cell's runs lack: no L."""
    return f"{column_name(axis)}={plain(level)}" if plain(level) is not None else f"no {column_name(axis)}"


def sentence(decision: Decision, said_edge: str | None, noise: str | None = None) -> str:
    """The decision in words: the decided best with its margin over the runner-up; undecided, each option the
    seeds cannot tell from the pick with its adjusted p (the closest first); or why nothing can be compared."""
    held = " ".join(name(k, v) for k, v in decision.cell.items())
    place = f"Stage {decision.stage}" + (f" at {held}" if held else "")
    axis, choice, column = decision.axis, decision.choice, column_name(decision.axis)
    if choice is None:  # the cell's runs have no value of the axis
        return f"{place}: no {column} to compare (its {runs(decision.no_level)} none)."
    if decision.decided and decision.equivalent:  # options equivalent within the margin: no one best
        named = partial(name, axis)
        same = decided_text(
            name(axis, choice),
            decision.comparisons,
            decision.equivalent,
            decision.alpha,
            named,
            decision.equivalence,
            decision.metric,
        )
        said = f"{place}: {same}"
    elif decision.decided and decision.margin is not None:
        m = decision.margin
        worse = worse_by(m.pct, m.ci_pct, decision.alpha, decision.p_value)
        said = f"{place}: {name(axis, choice)} is the best {column}; the runner-up {name(axis, m.over)} is {worse}"
    elif decision.comparisons:
        told = not_told(
            name(axis, choice),
            decision.comparisons,
            decision.alpha,
            partial(name, axis),
            seeds_text(list(decision.seeds.values())),
            decision.metric,
        )
        said = f"{place}: the best {column} is undecided: {told}"
    elif len(decision.seeds) == 1:
        said = f"{place}: only {name(axis, choice)} ran, nothing to compare"
    else:
        tied = and_([name(axis, t) for t in [choice, *decision.tied]])
        said = f"{place}: the best {column} is undecided among {tied} ({decision.why})"
    if decision.no_level:
        said += f"; {runs(decision.no_level)} no {column} (left out)"
    return said + "".join(f"; {part}" for part in (said_edge, noise) if part) + "."


def decide_stage(
    rows: pd.DataFrame, stage: str, axes: StageAxes, metric: str, alpha: float, asked: list[str] | None = None
) -> list[tuple[Decision, str | None]]:
    """Per axis (of `asked`) and per combination of the stage's other axes, variant, model and ladder rung: the best
    level, and whether it lies at the grid's edge."""
    rows = rows[rows["stage"] == stage]
    metric = stage_metric(rows, axes, metric)
    varied = decidable(rows, axes)
    rung = [HORIZON] if HORIZON in axes.columns and HORIZON in rows else []  # a ladder's: held, never decided
    held = [c for c in HELD if c in rows and c not in varied and rows[c].nunique(dropna=False) > 1]
    out = []
    for axis in wanted_axes(varied, asked):
        alongside = [c for c in held if rows.groupby(axis, dropna=False)[c].nunique(dropna=False).max() > 1]
        cell = [c for c in [*rung, *varied, *alongside] if c != axis]
        for decision in best(rows, metric, axis, cell, stage=stage, claim=CLAIM, alpha=alpha):
            compared = len(decision.seeds) > 1  # one level, or none: no best, so no edge either
            out.append((decision, edge(rows, axis, decision.choice) if compared else None))
    return out


def as_json(decision: Decision, said_edge: str | None, noise: str | None = None) -> dict[str, Any]:
    """A decision as findings.json holds it: its record, the edge note, and its sentence (`noise`: its metric's
    unseen noise, analysis.throughput)."""
    return {**decision.as_json(), "edge": said_edge, "said": sentence(decision, said_edge, noise)}


def mark(table: pd.DataFrame, decisions: list[tuple[Decision, str | None]]) -> pd.DataFrame:
    """The stage's table with a `<axis>_best` column per decided axis: best, tied (undecided: the pick and the
    levels not told from it), or empty where nothing was compared; matched through the columns the table shows."""
    decisions = [pair for pair in decisions if len(pair[0].seeds) > 1]
    for axis in dict.fromkeys(d.axis for d, _ in decisions):
        if column_name(axis) not in table:
            continue
        marks = {}
        for d, _ in (pair for pair in decisions if pair[0].axis == axis):
            shown = {column_name(k): v for k, v in d.cell.items() if column_name(k) in table}
            for level in [d.choice, *d.tied]:
                marks[(tuple(plain(v) for v in shown.values()), plain(level))] = BEST if d.decided else TIED
        keys = [column_name(k) for k in next(d.cell for d, _ in decisions if d.axis == axis) if column_name(k) in table]
        column = [
            marks.get((tuple(plain(row[k]) for k in keys), plain(row[column_name(axis)])), "")
            for _, row in table.iterrows()
        ]
        table = table.assign(**{f"{column_name(axis)}_best": column})
    return table
