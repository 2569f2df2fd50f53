"""Keep runs of different recipes apart in every table (docs/results.md): a recipe key (RECIPE_KEYS) is *mixed*
in a stage when it takes several values there that neither the stage's axes nor its variants explain (a narrowed
relaunch with another trainer.steps supersedes only the cells it re-ran); each table is then built once per recipe
of the stages it reads, each row naming its recipe in a column per mixed key. Without a mix, no column is added.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any

import pandas as pd

from cart_sweeps.config import RECIPE_KEYS

from .errors import AnalysisError
from .load import VARIANT_AXIS, Study


@dataclass(frozen=True)
class Part:
    """One recipe of the mixed stages a table reads: its columns' values and the runs it leaves out."""

    values: dict[str, Any] = field(default_factory=dict)  # column -> value, in the table's order (none: one recipe)
    dropped: frozenset[str] = frozenset()  # the mixed stages' runs of other recipes

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values.items())

    def rows(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame`'s rows of this recipe (all of them without a mixed stage)."""
        return frame[~frame["run"].isin(self.dropped)] if self.dropped and "run" in frame else frame

    def study(self, study: Study) -> Study:
        return replace(study, evals=self.rows(study.evals), train=self.rows(study.train)) if self.dropped else study


def mixed(rows: pd.DataFrame, axes: Iterable[str]) -> list[str]:
    """The recipe keys these rows (one stage's) differ in that its `axes` and its variants do not explain."""
    own = {str(a).rsplit(".", 1)[-1] for a in axes}
    # a key that follows a recipe axis (a ladder's warm-up shrinks with its horizon, trainer.steps) is constant
    # within that axis's values; a key that differs between cells of a model axis is a mix (a narrowed relaunch)
    by = [c for c in ("variant", VARIANT_AXIS, *sorted(own & set(RECIPE_KEYS))) if c in rows]
    keys = [k for k in RECIPE_KEYS if k in rows and k not in own]
    if rows.empty or not keys:
        return []
    groups = rows.groupby(by, dropna=False) if by else [((), rows)]
    return [k for k in keys if any(g[k].nunique(dropna=False) > 1 for _, g in groups)]


def parts(study: Study, stages: list[str]) -> list[Part]:
    """One part per combination of the recipes of the mixed stages among `stages`; a single whole part if none."""
    final = study.final()
    if final.empty or "stage" not in final:
        return [Part()]
    choices = []
    for stage in stages:
        rows = final[final["stage"] == stage]
        keys = mixed(rows, study.axes[stage].columns if stage in study.axes else [])
        if not keys:
            continue
        names = [k if len(stages) == 1 else f"{k} (stage {stage})" for k in keys]
        recipes = rows.groupby(keys, dropna=False, sort=True)["run"]  # a list of keys: each recipe a tuple
        choices.append([(dict(zip(names, recipe, strict=True)), set(runs)) for recipe, runs in recipes])
    if not choices:
        return [Part()]
    every = {run for options in choices for _, runs in options for run in runs}
    return [
        Part(
            {k: v for values, _ in combo for k, v in values.items()},
            frozenset(every - {run for _, runs in combo for run in runs}),
        )
        for combo in product(*choices)
    ]


def apart(pieces: list[Part], build: Callable[[Part], pd.DataFrame]) -> tuple[pd.DataFrame, dict[str, str]]:
    """The table built per part, its recipe columns in front (none for a single whole part), and why the parts that
    could not be built were not (by label). None built: the first part's error."""
    if pieces == [Part()]:
        return build(pieces[0]), {}
    built, failed, first = [], {}, None
    for piece in pieces:
        try:
            table = build(piece)
        except AnalysisError as error:
            failed[piece.label()] = str(error)
            first = first or error
            continue
        columns = {k: [v] * len(table) for k, v in piece.values.items() if k not in table}
        built.append(pd.concat([pd.DataFrame(columns, index=table.index), table], axis=1))
    if not built:
        assert first is not None
        raise first
    return pd.concat(built, ignore_index=True), failed
