"""The runs a stage's conclusions use, one definition for the analysis, `plan`, zoom and the dashboard: per cell
the newest configuration launched for it, the rest listed, never counted (docs/results.md); without a readable
ledger every run folder once. A reading is of one scale (cells are keyed by the paper's numbers, so a paper-scale
launch would otherwise supersede a tiny study): the one named, else the newest launch's with results."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from cart_sweeps.config import ConfigError
from cart_sweeps.record.runfolder import SUMMARY, atomic_write, read_summary
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.stagerecord.ledger import (
    LEDGER_FILES,
    Ledger,
    LedgerDamaged,
    merged_attempts,
    merged_launches,
    shared,
    status_of,
    trial_order,
)
from cart_sweeps.stagerecord.standing import stand, status_at
from cart_sweeps.status import RunStatus
from cart_sweeps.text import axis_value

RECORD = "stage.json"  # what a stage's driver records of it at each launch: StageRecord
OWNER = "owner"  # a trial's attr: the stage whose folder holds the run, when another stage trained it
SCALE_ATTR = "scale"  # a trial's attr: the scale its run was composed at
SCALES = "scales"  # stage.json: scale -> the newest record of a launch at that scale
PAPER = "paper"  # the scale of a run whose trial records none (conf/scale/paper.yaml's name)
UNRECORDED = "?"  # stage.json's SCALES: the record of a launch from before records named their scale
Cell = tuple[tuple[str, Any], ...]


def cell_of(params: Mapping[str, Any]) -> Cell:
    """A run's table cell: its params less the seed (a list as its text, axis_value)."""
    return tuple(sorted((k, axis_value(v)) for k, v in params.items() if k != "seed"))


@dataclass(frozen=True)
class StageRecord:
    """What the newest launch of a stage said about it, for readers without its config (the analysis)."""

    name: str
    role: str | None
    storage: str
    metric: str
    varied: list[str]  # the keys its runs differ in (grid, search, variants, command-line axes)
    search: bool = False  # a search stage (TPE): its runs are trials
    looks: int = 1  # how often its seed rule may decide (stage.max_seeds): each look tests at alpha / looks
    equivalence: float | None = None  # stage.equivalence: the relative margin its decisions state
    grid_seeds: int | None = None  # stage.max_seeds: the grid's seeds, where alpha is spent over the looks
    scale: str = PAPER  # the launch's scale: the file keeps the newest launch's record of each scale (`SCALES`)
    metrics: list[str] = field(default_factory=list)  # sweep.metrics where several: a multi-objective stage
    # stage.select=zoom: per width its candidates and the cells the screen could not rule out, with why
    promoted: list[dict[str, Any]] = field(default_factory=list)

    def write(self, sweep_dir: Path) -> None:
        """The newest record on top, and the newest of each scale under `SCALES` (an old one as `UNRECORDED`'s)."""
        path = sweep_dir / RECORD
        earlier = _read_json(path)
        scales = dict(earlier.get(SCALES) or {})
        if earlier and "scale" not in earlier:
            scales.setdefault(UNRECORDED, earlier)
        scales[self.scale] = self.__dict__
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps({**self.__dict__, SCALES: scales}, indent=2) + "\n"))

    @classmethod
    def read(cls, sweep_dir: Path, scale: str | None = None) -> StageRecord | None:
        """The newest launch's record (`scale`: at that scale; one naming none stands for any), else None."""
        data = _read_json(sweep_dir / RECORD)
        if scale is not None and "scale" in data:
            scales = data.get(SCALES) or {}
            data = scales.get(scale) or scales.get(UNRECORDED) or {}
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (TypeError, KeyError):
            return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_scale(attrs: Mapping[str, Any]) -> str:
    """A trial's scale: its `scale` attr, else (an old ledger) the `scale=` of its overrides, else the paper's."""
    if SCALE_ATTR in attrs:
        return str(attrs[SCALE_ATTR])
    chosen = [o.partition("=")[2] for o in attrs.get("overrides", []) if str(o).startswith("scale=")]
    return chosen[-1] if chosen else PAPER


@dataclass(frozen=True)
class StageRun:
    """One run of a stage, as its ledger and run folder describe it."""

    run_id: str
    label: str
    folder: Path  # under the current root
    params: dict[str, Any]  # its grid point in the paper's numbers (the ledger's params)
    actual: dict[str, Any]  # those of its params its scale changed, at the run's own numbers
    cell: Cell  # params less the seed (a reading is of one scale: its cells are that scale's)
    config: str  # what the seeds of one configuration share (its config id)
    launch: int  # index of the newest launch that stood for it (-1: none recorded)
    order: tuple[Any, ...]  # its newest trial's place among the stage's (ledger.trial_order)
    trial: int  # its newest trial's number
    status: str  # completed, failed, ..., lost (the ledger holds a result its folder lacks), new
    summary: RunSummary | None
    scale: str = PAPER


@dataclass(frozen=True)
class LeftOut:
    """A run folder or ledger run the conclusions do not use, and why."""

    label: str
    run: str  # the folder, relative to the runs root
    kind: str  # for counts: copy, moved, by hand, superseded, diverged, pruned, unreadable, other launch
    reason: str
    differs: list[str] = field(default_factory=list)  # for a superseded run: "trainer.lr 0.003 -> 0.001"


@dataclass
class RunSet:
    stage: str
    basis: str
    used: list[StageRun] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # labels the conclusions need whose folder is gone
    pending: list[StageRun] = field(default_factory=list)  # cells' runs without a result yet (failed, running, ...)
    record: StageRecord | None = None
    scale: str | None = None  # the scale read (None: without a ledger, every folder's run)


def stage_runs(root: Path, stage: str, launch: int | None = None, scale: str | None = None) -> RunSet:
    """The runs the conclusions of `stage` use, from every ledger of it; `launch` N (from 1): only those launch N
    stood for; `scale`: at that scale (None: the newest launch's with results)."""
    sweep_dir = root / stage
    record = StageRecord.read(sweep_dir)
    ledgers, damaged = stage_ledgers(sweep_dir, stage, record)
    if not ledgers:
        if launch is not None:
            raise LedgerDamaged(f"stage {stage} has no readable ledger in {sweep_dir}")
        why = "its ledger does not open; the next launch of the stage rebuilds it" if damaged else "no ledger"
        out = _folders_only(root, stage, f"all runs of the folder ({why}, so no launches to choose from)")
    else:
        out = _from_ledger(root, stage, ledgers, launch, scale)
    out.record = StageRecord.read(sweep_dir, out.scale) if out.scale is not None else record
    return out


def stage_ledgers(
    sweep_dir: Path, stage: str, record: StageRecord | None, skip: str | None = None
) -> tuple[list[Ledger], bool]:
    """Every study of the stage in its own ledger files and the shared storage its newest launch recorded, but
    `skip` (open already: opening costs 0.4 s); and whether one does not open."""
    kinds = [*LEDGER_FILES, *([record.storage] if record and shared(record.storage) else [])]
    ledgers: list[Ledger] = []
    damaged = False
    for kind in (k for k in kinds if k != skip):
        try:
            ledgers += Ledger.read_all(sweep_dir, stage, kind)
        except (LedgerDamaged, ConfigError):
            damaged = True
    return ledgers, damaged


def _from_ledger(root: Path, stage: str, ledgers: list[Ledger], launch: int | None, scale: str | None) -> RunSet:
    attempts, launches = merged_attempts(ledgers), merged_launches(ledgers)
    newest = {rid: i for i, record in enumerate(launches) for rid in record["run_ids"]}
    if launch is not None and not 1 <= launch <= len(launches):
        raise LedgerDamaged(f"stage {stage} has launches 1..{len(launches)}")
    chosen = set(launches[launch - 1]["run_ids"]) if launch is not None else None
    runs = [_stage_run(root, stage, rid, trials, newest) for rid, trials in attempts.items()]
    read = scale or _read_scale([r for r in runs if chosen is None or r.run_id in chosen])
    basis = (
        f"launch {launch} of {len(launches)} (at {launches[launch - 1]['at']})"
        if launch is not None
        else f"each cell's newest configuration over {len(launches)} launch{'es' * (len(launches) != 1)}"
    )
    others = sorted({r.scale for r in runs} - {read})
    if others:
        basis += f", at scale={read} (the stage also holds runs at scale={', '.join(others)}: read apart)"
    out = RunSet(stage, basis, scale=read)
    cells: dict[Cell, list[StageRun]] = defaultdict(list)
    for run in runs:
        if run.scale != read:
            if run.status == RunStatus.COMPLETED:
                out.left_out.append(_left(root, run, "other scale", f"scale={run.scale}, not this reading's {read}"))
        elif chosen is None or run.run_id in chosen:
            cells[run.cell].append(run)
        elif run.status == RunStatus.COMPLETED:
            out.left_out.append(_left(root, run, "other launch", f"not in launch {launch}"))
    for group in cells.values():
        _choose_cell(root, group, out)
    named = {run.folder for run in runs}
    by_id = {run.run_id: run for run in runs}
    for folder, summary in _folders(root, stage):
        if folder in named:
            continue
        if summary is None:
            out.left_out.append(LeftOut(folder.name, _rel(root, folder), UNREADABLE, UNREADABLE))
            continue
        owner = by_id.get(summary.run_id or "")
        if owner and owner.status == "lost":  # its ledger's folder is gone: this is it, moved (put back by hand)
            kind, why = "moved", f"{owner.label}, moved from {_rel(root, owner.folder)}: put it back there"
        elif owner:
            kind, why = "copy", f"a copy of {owner.label}: its ledger names {_rel(root, owner.folder)}"
        else:
            kind, why = "by hand", "started by hand: in no launch"
        out.left_out.append(LeftOut(summary.label or folder.name, _rel(root, folder), kind, why))
    return out


def _read_scale(runs: list[StageRun]) -> str:
    """The scale read when none is named: the newest launch's with a completed run, else the newest's."""
    done = [r for r in runs if r.status == RunStatus.COMPLETED] or runs
    return max(done, key=lambda r: (r.launch, r.order)).scale if done else PAPER


def recorded_folder(root: Path, stage: str, attrs: Mapping[str, Any]) -> Path:
    """The folder a trial's attrs name for its run under `root`: in its stage's folder, or its `owner`'s."""
    return root / str(attrs.get(OWNER, stage)) / Path(str(attrs.get("run_dir", attrs.get("run_id")))).name


def _stage_run(root: Path, stage: str, run_id: str, trials: list[FrozenTrial], newest: dict[str, int]) -> StageRun:
    last = trials[-1]
    attrs = last.user_attrs
    folder = recorded_folder(root, stage, attrs)
    summary = read_summary(folder)
    holds = summary is not None and summary.run_id == run_id
    result = summary if holds and summary is not None and summary.is_result else None
    status = status_at(stand(last, result is not None), last, result)  # as the driver classifies it
    params = {k: axis_value(v) for k, v in last.params.items()}  # a list (an earlier version's ledger) as text
    scale = run_scale(attrs)
    config = attrs.get("config_id") or (summary.details.get("config_id") if holds and summary else None)
    if config is None:  # a ledger from before config ids were recorded, and no result yet
        config = json.dumps([o for o in attrs.get("overrides", []) if not o.startswith("seed=")])
    return StageRun(
        run_id=run_id,
        label=str(attrs.get("label", run_id)),
        folder=folder,
        params=params,
        actual=dict(attrs.get("actual", {})),
        cell=cell_of(params),
        config=str(config),
        launch=newest.get(run_id, -1),
        order=trial_order(last),
        trial=_own_trial(trials, result is not None).number,
        status=status,
        summary=summary if holds else None,
        scale=scale,
    )


def _own_trial(trials: list[FrozenTrial], has_result: bool) -> FrozenTrial:
    """The trial a run's row names: the newest that recorded its result (a later failed attempt lends none its
    value), else its newest."""
    return next((t for t in reversed(trials) if status_of(t).is_result), trials[-1]) if has_result else trials[-1]


def _choose_cell(root: Path, group: list[StageRun], out: RunSet) -> None:
    """The cell's runs of its newest launched configuration: used, pending or missing; the rest superseded."""
    latest = max(group, key=lambda r: (r.launch, r.order))
    for run in sorted(group, key=lambda r: r.label):
        if run.config != latest.config:
            if run.status == RunStatus.COMPLETED:
                why = "superseded by a newer configuration"
                out.left_out.append(_left(root, run, "superseded", why, _changes(run, latest)))
        elif run.status == RunStatus.COMPLETED:
            out.used.append(run)
        elif run.status == "lost":
            out.missing.append(run.label)
        elif run.status in (RunStatus.DIVERGED, RunStatus.PRUNED):  # ended, with no final value to table
            out.left_out.append(_left(root, run, run.status, run.status))
        else:
            out.pending.append(run)


def _left(root: Path, run: StageRun, kind: str, reason: str, differs: list[str] | None = None) -> LeftOut:
    return LeftOut(run.label, _rel(root, run.folder), kind, reason, differs or [])


def _changes(old: StageRun, new: StageRun) -> list[str]:
    """The recorded settings that differ between two configurations: 'trainer.lr 0.003 -> 0.001'."""
    if old.summary is None or new.summary is None:
        return []
    a, b = old.summary.config(), new.summary.config()
    return [f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted((set(a) | set(b)) - {"seed"}) if a.get(k) != b.get(k)]


UNREADABLE = "unreadable"


def _folders(root: Path, stage: str) -> list[tuple[Path, RunSummary | None]]:
    """Every folder under the stage's folder holding a summary.json, with it (None: it does not parse)."""
    base = root / stage
    return [(p.parent, read_summary(p.parent)) for p in sorted(base.rglob(SUMMARY))] if base.is_dir() else []


def _folders_only(root: Path, stage: str, basis: str) -> RunSet:
    """Without a ledger: every folder's run once; copies (of a canonical folder, or another stage's run) aside."""
    out = RunSet(stage, basis)
    folders = _folders(root, stage)
    canonical = {s.run_id for f, s in folders if s and s.run_id and f.name == f"{s.label}-{s.run_id[:8]}"}
    for folder, summary in folders:
        if summary is None:
            out.left_out.append(LeftOut(folder.name, _rel(root, folder), UNREADABLE, UNREADABLE))
            continue
        label, trained_by = summary.label or folder.name, str(summary.details.get("stage") or stage)
        if summary.run_id in canonical and folder.name != f"{summary.label}-{(summary.run_id or '')[:8]}":
            out.left_out.append(LeftOut(label, _rel(root, folder), "copy", f"a copy of {label}"))
            continue
        if trained_by != stage and (root / trained_by).is_dir():  # copied in from the stage that trained it
            out.left_out.append(LeftOut(label, _rel(root, folder), "copy", f"a copy of stage {trained_by}'s {label}"))
            continue
        run_id = summary.run_id or _rel(root, folder)
        run = StageRun(
            run_id, label, folder, {}, {}, (("run", run_id),), str(summary.details.get("config_id")), -1,
            (), -1, str(summary.status), summary,
        )  # fmt: skip
        _choose_cell(root, [run], out)
    return out


def _rel(root: Path, folder: Path) -> str:
    try:
        return str(folder.relative_to(root))
    except ValueError:
        return str(folder)
