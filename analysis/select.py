"""Which runs each stage's tables use, and why the others do not.

A stage folder collects every run ever made for it: earlier launches with other settings (another
trainer.lr, say), runs started by hand. By default a stage is tabled from its newest launch, as its
ledger records it; `--where` narrows further; and one table cell never averages two configurations
(runs that differ in anything but the seed). Whatever is left out is listed, never dropped silently.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from analysis.load import AnalysisError, RunRecord, Study
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.ledger import LEDGER_FILES, Ledger, LedgerDamaged

LATEST, ALL = "latest", "all"


@dataclass
class Exclusion:
    """A completed run of the stage the tables leave out."""

    label: str
    run: str
    reason: str
    differs: list[str]  # how its config differs from the runs chosen: "trainer.lr 0.001 vs 0.003"


@dataclass
class StageSelection:
    """What one stage's tables use: the runs' basis (a launch, or all runs), filters, and what is left out."""

    stage: str
    basis: str
    runs: int = 0
    filters: list[str] = field(default_factory=list)
    excluded: list[Exclusion] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # runs of the chosen launch without a run folder

    def line(self) -> str:
        """One line for each table and the report: 'stage 1: launch 2 of 2 (at ...), 2 runs; where ...'."""
        text = f"stage {self.stage}: {self.basis}, {self.runs} run{'s' * (self.runs != 1)}"
        return text + (f"; where {', '.join(self.filters)}" if self.filters else "")

    def details(self) -> list[str]:
        """The runs left out and the runs missing, one line each."""
        lines = [f"left out {e.run}: {'; '.join([e.reason, *e.differs])}" for e in self.excluded]
        return lines + [f"missing {label}: in the runs chosen, but its run folder is gone" for label in self.missing]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_where(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, value), the value read as JSON where it can be (1e-3, 32, true), else as text."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise AnalysisError(f"--where {text}: expected KEY=VALUE, e.g. trainer.lr=1e-3")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def choose(study: Study, launch: str = LATEST, where: list[str] | None = None) -> Study:
    """`study` restricted to the runs each stage's tables use; `selection` says which and why."""
    filters = {text: parse_where(text) for text in where or []}
    completed = [r for r in study.records if r.status == RunStatus.COMPLETED]
    for text, (key, _) in filters.items():
        if not any(key in r.config or key == "seed" for r in completed):
            raise AnalysisError(f"--where {text}: no run records {key} (keys look like trainer.lr, model.d_model)")
    stages: dict[str, list[RunRecord]] = defaultdict(list)
    for record in study.records:
        stages[record.stage].append(record)
    selection = {
        stage: _choose_stage(Path(study.source) / stage, stage, records, launch, filters)
        for stage, records in sorted(stages.items())
    }
    excluded = {e.run for s in selection.values() for e in s.excluded}
    kept = {r.run for r in completed} - excluded
    evals = study.evals[study.evals["run"].isin(kept)].reset_index(drop=True)
    train = study.train[study.train["run"].isin(kept)].reset_index(drop=True) if not study.train.empty else study.train
    return replace(study, evals=evals, train=train, selection=selection)


@dataclass
class _Launches:
    """What a stage's ledger says: the run ids the tables may use (None: all), each run's newest launch, labels."""

    chosen: set[str] | None
    basis: str
    newest: dict[str, int] = field(default_factory=dict)  # run id -> index of its newest launch
    ledger: set[str] = field(default_factory=set)  # every run id the ledger holds
    labels: dict[str, str] = field(default_factory=dict)


def _read_ledger(stage_dir: Path, stage: str) -> Ledger | None:
    return next((lg for kind in LEDGER_FILES if (lg := Ledger.read(stage_dir, stage, kind)) is not None), None)


def _launches(stage_dir: Path, stage: str, launch: str) -> _Launches:
    try:
        ledger, why = _read_ledger(stage_dir, stage), "no ledger"
    except LedgerDamaged:
        ledger, why = None, "its ledger does not open; the next launch of the stage rebuilds it"
    if ledger is None:
        if launch not in (LATEST, ALL):
            raise AnalysisError(f"--launch {launch}: stage {stage} has no readable ledger in {stage_dir}")
        return _Launches(None, f"all runs of the folder ({why}, so no launches to choose from)")
    attempts = ledger.attempts()
    labels = {rid: trials[-1].user_attrs.get("label", rid) for rid, trials in attempts.items()}
    launches = ledger.launches()
    if not launches:
        if launch not in (LATEST, ALL):
            raise AnalysisError(f"--launch {launch}: the ledger of stage {stage} records no launches")
        return _Launches(set(attempts), "all runs its ledger holds (it records no launches)", {}, set(attempts), labels)
    newest = {rid: i for i, record in enumerate(launches) for rid in record["run_ids"]}
    if launch == ALL:
        chosen, basis = set(newest), f"all {len(launches)} launches"
    else:
        n = len(launches) if launch == LATEST else int(launch)
        if not 1 <= n <= len(launches):
            raise AnalysisError(f"--launch {launch}: stage {stage} has launches 1..{len(launches)}")
        chosen = set(launches[n - 1]["run_ids"])
        basis = f"launch {n} of {len(launches)} (at {launches[n - 1]['at']})"
    return _Launches(chosen, basis, newest, set(attempts), labels)


def _choose_stage(
    stage_dir: Path, stage: str, records: list[RunRecord], launch: str, filters: dict[str, tuple[str, Any]]
) -> StageSelection:
    known = _launches(stage_dir, stage, launch)
    present = {r.run_id for r in records}
    missing = sorted(known.labels.get(i, i) for i in (known.chosen or set()) - present)
    selection = StageSelection(stage, known.basis, filters=list(filters), missing=missing)
    out: list[tuple[RunRecord, str]] = []
    candidates = []
    for record in (r for r in records if r.status == RunStatus.COMPLETED):
        if known.chosen is not None and record.run_id not in known.chosen:
            out.append((record, _not_chosen(record.run_id, known)))
        elif failed := [t for t, (k, v) in filters.items() if _value(record, k) != v]:
            out.append((record, f"not {', '.join(failed)}"))
        else:
            candidates.append(record)
    kept, mixed = _one_config_per_cell(candidates, known.newest)
    out += [(r, "an older configuration of its table cell") for r in mixed]
    selection.runs = len(kept)
    selection.excluded = [Exclusion(r.label, r.run, why, _differences(r, kept)) for r, why in out]
    return selection


def _not_chosen(run_id: str | None, known: _Launches) -> str:
    if run_id in known.newest:
        return f"from launch {known.newest[run_id] + 1}"
    return "in no recorded launch" if run_id in known.ledger else "started by hand: in no launch"


def _value(record: RunRecord, key: str) -> Any:
    return record.seed if key == "seed" else record.config.get(key)


def _config_key(record: RunRecord, by_id: bool) -> str:
    return str(record.config_id) if by_id else json.dumps(record.config, sort_keys=True, default=str)


def _one_config_per_cell(records: list[RunRecord], newest: dict[str, int]) -> tuple[list[RunRecord], list[RunRecord]]:
    """Per table cell, the runs of its newest configuration (newest launch, then newest summary), and the rest.

    Configurations compare by config_id; where a cell holds summaries older than config_id, by the
    recorded config itself (seed excluded)."""
    cells: dict[tuple[Any, ...], list[RunRecord]] = defaultdict(list)
    for record in records:
        cells[record.cell].append(record)
    kept: list[RunRecord] = []
    mixed: list[RunRecord] = []
    for group in cells.values():
        by_id = all(r.config_id for r in group)
        latest = max(group, key=lambda r: (newest.get(r.run_id or "", -1), r.written))
        for record in group:
            same = _config_key(record, by_id) == _config_key(latest, by_id)
            (kept if same else mixed).append(record)
    return kept, mixed


def _differences(record: RunRecord, kept: list[RunRecord]) -> list[str]:
    """How `record`'s config differs from the chosen runs of its cell (else of its stage), on the values
    those runs share: 'trainer.lr 0.001 vs 0.003'."""
    reference = [r for r in kept if r.cell == record.cell] or kept
    if not reference:
        return []
    keys = sorted({k for r in reference for k in r.config} | set(record.config))
    out = []
    for key in keys:
        values = {json.dumps(r.config.get(key), default=str) for r in reference}
        mine = json.dumps(record.config.get(key), default=str)
        if len(values) == 1 and mine not in values:
            out.append(f"{key} {mine} vs {values.pop()}")
    return out
