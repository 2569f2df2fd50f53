"""Which runs each stage's tables use, and why the others do not: the stage's run set (stagerecord.runset), as
`plan`, zoom and the dashboard read it, or one launch's (--launch N), narrowed by --where; the rest is listed."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cart_sweeps.metric import metric
from cart_sweeps.record.runfolder import SUMMARY
from cart_sweeps.stagerecord.ledger import LEDGER_FILES, LedgerDamaged
from cart_sweeps.stagerecord.runset import RECORD, LeftOut, RunSet, StageRecord, StageRun, stage_runs

from .errors import AnalysisError
from .stages import roles_of


@dataclass
class StageSelection:
    """What one stage's tables use: their basis, filters, and what is left out."""

    stage: str
    role: str | None
    basis: str
    runs: int = 0
    filters: list[str] = field(default_factory=list)
    excluded: list[LeftOut] = field(default_factory=list)  # the run set's, and those --where, NOT_FINITE, ... leave
    missing: list[str] = field(default_factory=list)  # runs the tables need whose run folder is gone
    pending: dict[str, int] = field(default_factory=dict)  # status -> runs the tables need without a result yet

    def line(self) -> str:
        """One line for each table and the report: 'stage 1: each cell's newest configuration ..., 2 runs'."""
        text = f"stage {self.stage}: {self.basis}, {self.runs} run{'s' * (self.runs != 1)}"
        if self.pending:
            text += f" ({', '.join(f'{n} {s}' for s, n in self.pending.items())}: no result yet)"
        return text + (f"; where {', '.join(self.filters)}" if self.filters else "")

    def details(self) -> list[str]:
        """The runs left out and the runs missing, one line each."""
        lines = [left_line(e) for e in self.excluded]
        return lines + [f"missing {label}: in the runs chosen, but its run folder is gone" for label in self.missing]


def left_line(left: LeftOut) -> str:
    """'left out 1/d32-P2-R4-s1: superseded; trainer.lr 0.003 -> 0.001' (a CSV row: 'results.csv line 5')."""
    return f"left out {left.run}: {'; '.join([left.reason, *left.differs])}"


def parse_where(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, value), the value read as JSON where it can be (1e-3, 32, true), else as text."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise AnalysisError(f"--where {text}: expected KEY=VALUE, e.g. trainer.lr=1e-3")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def stage_folders(root: Path) -> list[str]:
    """The stages under `root`: folders holding a ledger, a stage record or a run's summary.json."""
    if not root.is_dir():
        return []
    marks = [*LEDGER_FILES.values(), RECORD]
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and (any((p / f).exists() for f in marks) or next(p.rglob(SUMMARY), None))
    )


@dataclass
class Chosen:
    """One stage's choice: what its tables use (and why), the runs themselves, and its launch's record."""

    selection: StageSelection
    runs: list[StageRun]
    record: StageRecord | None


def choose(root: Path, launch: int | None = None, where: list[str] | None = None) -> dict[str, Chosen]:
    """Per stage under `root`: what its tables use, and the runs themselves."""
    stages = stage_folders(root)
    if not stages:
        raise AnalysisError(
            f"no run folders under {root} (expected {root}/<stage>/<run>/summary.json); "
            "pass --runs DIR or --from-csv FILE"
        )
    filters = {text: parse_where(text) for text in where or []}
    try:
        sets = [stage_runs(root, stage, launch=launch) for stage in stages]
    except LedgerDamaged as err:
        raise AnalysisError(f"--launch {launch}: {err}") from err
    for text, (key, _) in filters.items():
        if not any(key in _config(run) for runs in sets for run in runs.used):
            raise AnalysisError(f"--where {text}: no run records {key} (keys look like trainer.lr, model.d_model)")
    roles = roles_of(root, stages)
    return {runs.stage: _narrow(runs, roles.get(runs.stage), filters) for runs in sets}


def _narrow(runs: RunSet, role: str | None, filters: dict[str, tuple[str, Any]]) -> Chosen:
    selection = StageSelection(runs.stage, role, runs.basis, filters=list(filters), missing=list(runs.missing))
    selection.pending = dict(Counter(str(run.status) for run in runs.pending))
    selection.excluded = list(runs.left_out)
    kept = []
    for run in runs.used:
        where = f"{runs.stage}/{run.folder.name}"
        if bad := _invalid(run):
            selection.excluded.append(LeftOut(run.label, where, *bad))
        elif failed := [t for t, (k, v) in filters.items() if _config(run).get(k) != v]:
            selection.excluded.append(LeftOut(run.label, where, "filtered", f"not {', '.join(failed)}"))
        else:
            kept.append(run)
    selection.runs = len(kept)
    return Chosen(selection, kept, runs.record)


NOT_FINITE = "not finite"  # a completed run whose summary holds a NaN or infinite metric: listed, never tabled
OUT_OF_RANGE = "out of range"  # ... or a value its metric cannot take (a perplexity <= 1): listed, never tabled


def _invalid(run: StageRun) -> tuple[str, str] | None:
    """(kind, reason) for the first of a run's recorded metrics that is no measurement, if any."""
    for key, value in (run.summary.metrics if run.summary else {}).items():
        if not isinstance(value, int | float):
            return NOT_FINITE, f"{key}={value} is not a finite number"
        if (fault := unmeasured(key, value))[1]:
            return fault
    return None


def unmeasured(column: str, value: float) -> tuple[str, str]:
    """Why `value` of `column` measures nothing, as (kind, reason): not finite, or outside its metric's range
    (Metric.valid: a perplexity <= 1, an accuracy > 1); ("", "") where it is a measurement."""
    record = metric(column)
    finite = bool(np.isfinite(value))
    reason = record.invalid_reason(value) if record else "" if finite else f"{column}={value} is not a finite number"
    return (OUT_OF_RANGE if finite else NOT_FINITE) if reason else "", reason


def _config(run: StageRun) -> dict[str, Any]:
    return run.summary.config() if run.summary else {}
