"""Run folders or a results CSV as one tidy frame of evaluations (a row per run, stage and step), so every table
reads one shape; a run several stages share has a row under each, one `run_id` (tables.select counts it once)."""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from cart_sweeps.config import AXIS, RECIPE_KEYS, ModelConfig, keys_with
from cart_sweeps.metric import DEFAULT, metric, require_error
from cart_sweeps.model.params import train_flops_per_token
from cart_sweeps.record.metrics import read_metrics
from cart_sweeps.record.runfolder import CONFIG, METRICS, SUMMARY
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.rules.axes import STEPS
from cart_sweeps.rules.ladder_walk import RECORD_FILE
from cart_sweeps.stagerecord.runset import UNREADABLE, LeftOut, StageRun
from cart_sweeps.status import RunStatus

from . import csv_input
from .errors import AnalysisError
from .select import NOT_FINITE, OUT_OF_RANGE, Chosen, StageSelection, choose
from .stages import roles_of
from .throughput import shared

MODEL_KEYS = keys_with(ModelConfig, AXIS)
INT_COLUMNS: tuple[str, ...] = (*MODEL_KEYS, "seed", "step", "eval_n_loops", "trained_n_loops", "steps")
INT_COLUMNS += ("warmup_steps", "trial", "looks", "grid_seeds", "num_fewshot")
RUN_KEY = ("stage", "model", "variant", *MODEL_KEYS, "seed", "eval_n_loops", "num_fewshot")
TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens", "rho", "tokens_per_s")
CELL = ("model", "variant", *MODEL_KEYS, "eval_n_loops", "num_fewshot")  # per stage
FLOPS = "gflops_per_token"  # a run's training FLOPs per token (forward + backward), in units of 10^9
ZOOM_ALLOWANCE = "zoom_allowance"  # a zoom stage's record: the relative drift allowance its candidates took
VARIANT_AXIS = "stage.variant"  # the column of a stage's named variants (`variant` is the ablation label)

__all__ = ["AnalysisError", "Study", "load_csv", "load_runs"]


@dataclass(frozen=True)
class StageAxes:
    """What a stage varies, as columns of the frames, and how its own table ranks them."""

    columns: list[str]  # seed last where seeds vary
    metric: str | None = None  # its sweep metric (None: the analysis's ranking metric)
    search: bool = False  # a search: tabled trial by trial
    metrics: tuple[str, ...] = ()  # its objectives where several (sweep.metrics): analysis/pareto.py


@dataclass
class Study:
    """Everything analysis reads: evaluations, the training log, the runs left out, and (from run
    folders) which runs each stage's tables use and why."""

    evals: pd.DataFrame
    train: pd.DataFrame = field(default_factory=pd.DataFrame)
    not_completed: dict[str, int] = field(default_factory=dict)
    source: str = ""
    selection: dict[str, StageSelection] = field(default_factory=dict)
    axes: dict[str, StageAxes] = field(default_factory=dict)  # stage -> what it varies
    left_out: list[LeftOut] = field(default_factory=list)  # a CSV's rows, runs without the ranking metric: listed
    unread: dict[str, str] = field(default_factory=dict)  # stage -> why the analysis could not read it: left out

    def final(self) -> pd.DataFrame:
        """The last evaluated step of every run of every stage: what the tables rank ("at the last step")."""
        return last_steps(self.evals)


def last_steps(evals: pd.DataFrame) -> pd.DataFrame:
    """Each (stage, run)'s last evaluated step."""
    if evals.empty:
        return evals
    if "step" in evals:
        evals = evals.sort_values("step", kind="stable", na_position="first")
    return evals.groupby(["stage", "run"], sort=False, dropna=False).tail(1).reset_index(drop=True)


def require(rows: pd.DataFrame, columns: list[str], table: str) -> None:
    """Fail in one line naming the first column `table` needs that these rows lack (absent or all empty)."""
    for column in columns:
        if column not in rows.columns:
            raise AnalysisError(f"table {table!r} needs column {column!r}, which the input lacks")
        if rows[column].isna().all():
            raise AnalysisError(f"table {table!r} needs column {column!r}, which is empty for the runs it reads")


def metric_columns(rows: pd.DataFrame, prefix: str = "") -> list[str]:
    """The columns holding data, sorted: those starting with `prefix` (ppl_: the validation sets these rows were
    scored on; bench_: their lm-eval tasks), else those of a metric whose direction is known (cart_sweeps.metric)."""
    return sorted(c for c in rows.columns if (c.startswith(prefix) if prefix else metric(c)) and rows[c].notna().any())


def ppl_sets(rows: pd.DataFrame) -> list[str]:
    return metric_columns(rows, "ppl_")


def bench_sets(rows: pd.DataFrame) -> list[str]:
    return metric_columns(rows, "bench_")


ASKED, PAPERS = "as --metric asks", "the paper's"  # why the analysis ranks by its metric, beside the fallback's


def pick_metric(rows: pd.DataFrame, requested: str | None) -> tuple[str, str]:
    """The ranking metric and why it is the one: --metric's, the paper's, or a fallback (a corpus without the
    paper's wiki set: the first ppl_*). Any metric whose record says which way is better may be asked for."""
    if requested:
        if metric(requested) is None:
            raise AnalysisError(f"--metric {require_error(requested)}")
        if requested not in rows.columns or rows[requested].isna().all():
            raise AnalysisError(f"--metric {requested}: no run has it (have: {', '.join(metric_columns(rows))})")
        return requested, ASKED
    sets = ppl_sets(rows)
    if DEFAULT in sets:
        return DEFAULT, PAPERS
    if not sets:
        raise AnalysisError("the input has no ppl_<set> column to rank runs by")
    return sets[0], f"since {DEFAULT} is absent (the first ppl_* column in sorted order)"


def rank_values(values: pd.Series, name: str) -> pd.Series:
    """`values` of metric `name` oriented so that lower ranks first, as every table ranks (an accuracy negated)."""
    found = metric(name)
    return values * (found.sign if found else 1)


def load_csv(path: str | Path) -> Study:
    """A results CSV (one row per run, or per run and step), checked as run folders are (analysis.csv_input):
    rows with a status other than completed are counted, rows that measure nothing listed, and both left out."""
    path = Path(path)
    if not path.is_file():
        raise AnalysisError(f"--from-csv {path}: no such file")
    numbers = (*INT_COLUMNS, "rho", "lr", "min_lr", "weight_decay")
    frame, left_out, not_completed = csv_input.read(path, run_key=RUN_KEY, whole=INT_COLUMNS, numbers=numbers)
    frame = _normalise(frame) if len(frame) else frame  # none: said as such by report.run
    if "role" not in frame:
        frame["role"] = frame["stage"].map(roles_of(None, sorted(frame["stage"].unique())))
    axes = {  # per stage, the columns its rows differ in (the seed last)
        str(stage): StageAxes([c for c in (*CELL, "seed") if c in rows and rows[c].nunique(dropna=True) > 1])
        for stage, rows in frame.groupby("stage")
    }
    return Study(frame, not_completed=not_completed, source=str(path), axes=axes, left_out=left_out)


def load_runs(root: str | Path, launch: int | None = None, where: list[str] | None = None) -> Study:
    """The runs each stage's tables use under `root` (analysis.select), read from their folders
    (summary.json + metrics.jsonl; a metrics.jsonl cut off mid-line is read up to its last whole line)."""
    root = Path(root)
    chosen = choose(root, launch, where)
    evals: list[dict[str, Any]] = []
    train: list[dict[str, Any]] = []
    left_out: Counter[str] = Counter()
    axes, unread = {}, {}
    for stage, choice in list(chosen.items()):
        try:
            stage_evals, stage_train = _stage_rows(root, stage, choice)
            axes[stage] = _stage_axes(choice)
        except Exception as error:  # noqa: BLE001 (a stage the analysis cannot read is left out, said in a line)
            unread[stage] = unreadable(error)
            del chosen[stage]
            continue
        evals += stage_evals
        train += stage_train
        left_out.update(choice.selection.pending)
        ended = (RunStatus.DIVERGED, RunStatus.PRUNED, UNREADABLE, NOT_FINITE, OUT_OF_RANGE)
        left_out.update(e.kind for e in choice.selection.excluded if e.kind in ended)
    varied = {c for a in axes.values() for c in a.columns}
    study_evals = _normalise(_whole(pd.DataFrame(evals), evals, varied)) if evals else pd.DataFrame()
    study_train = _normalise(_whole(pd.DataFrame(train), train, varied)) if train else pd.DataFrame()
    selections = {stage: choice.selection for stage, choice in chosen.items()}
    return Study(study_evals, study_train, dict(sorted(left_out.items())), str(root), selections, axes, unread=unread)


def unreadable(error: Exception) -> str:
    """Why a stage (or one of its outputs) could not be read or built, in a line: the input's own words where
    the analysis gives them, else the error's."""
    return str(error) if isinstance(error, AnalysisError) else f"{type(error).__name__}: {error}"


def _settled_steps(folder: Path, scale: str) -> set[int] | None:
    """A ladder's rungs (in its runs' steps at `scale`) where it promoted nothing: where its claims are final, and
    so where the analysis states its margin. At a rung it promoted from, the ladder tests equivalence within the
    margin less its drift allowance, which the analysis does not apply. None where the stage is no ladder."""
    path = folder / RECORD_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    design = record["design"]
    steps = (design.get("steps") or {}).get(scale) or design["rungs"]
    promoted = {r["steps"] for r in record["records"] if r["action"] == "promoted"}
    return {at for at, rung in zip(steps, design["rungs"], strict=True) if rung not in promoted}


def _stage_rows(root: Path, stage: str, choice: Chosen) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One stage's evaluation rows and training-log rows, from its runs' folders."""
    evals: list[dict[str, Any]] = []
    train: list[dict[str, Any]] = []
    settled = _settled_steps(root / stage, choice.record.scale) if choice.record else None
    for run in choice.runs:
        summary = run.summary
        assert summary is not None  # a used run holds its result
        meta = {**_run_meta(stage, summary, run, root), **_axis_values(run), "role": choice.selection.role}
        if choice.record and choice.record.looks > 1:  # a stage that added seeds while undecided
            meta["looks"] = choice.record.looks
        if choice.record and choice.record.looks > 1 and choice.record.grid_seeds:  # alpha spent over its looks
            meta["grid_seeds"] = choice.record.grid_seeds
        if choice.record and choice.record.promoted:  # stage.select=zoom: the drift allowance its candidates took
            meta[ZOOM_ALLOWANCE] = choice.record.promoted[0].get("drift_allowance")
        if choice.record and choice.record.equivalence is not None and (settled is None or meta.get(STEPS) in settled):
            meta["equivalence"] = choice.record.equivalence  # stage.equivalence: its decisions' margin
        logged: dict[Any, dict[str, Any]] = {}  # step -> its evaluation (a resumed run logs a step again: the newest)
        for event in read_metrics(run.folder / METRICS):
            if event.get("kind") == "train":
                row = {k: event.get(k) for k in TRAIN_KEYS}
                train.append({**meta, "step": event.get("step"), **_numbers(row, run.folder / METRICS)})
            elif event.get("kind") == "eval":
                logged[event.get("step")] = _scores(event)
        logged.pop(summary.step, None)  # the last evaluation: its numbers are the summary's, read from it alone
        evals += [{**meta, "step": step, **scores} for step, scores in logged.items()]
        evals.append({**meta, **_scores(summary.results()), "step": summary.step})
    return evals, train


def _numbers(row: dict[str, Any], path: Path) -> dict[str, Any]:
    """`row`'s values, each a number or missing; anything else is the file's damage, named."""
    for key, value in row.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise AnalysisError(f"{path}: {key} is {json.dumps(value)}, not a number")
    return row


def _whole(frame: pd.DataFrame, records: list[dict[str, Any]], axes: set[str]) -> pd.DataFrame:
    """The axes every run records as integers, as integers (Int64): pandas makes a column of ints a float one
    where a value is missing (a stage that does not vary the axis, a dense run's R), and d=64 would read 64.0."""
    whole = [
        c
        for c in axes
        if c in frame
        and pd.api.types.is_float_dtype(frame[c])
        and all(isinstance(v, int) and not isinstance(v, bool) for r in records if (v := r.get(c)) is not None)
    ]
    return frame.astype({c: "Int64" for c in whole})


def _axis_values(run: StageRun) -> dict[str, Any]:
    """The run's value of each key its stage varies, at its own numbers (named variants as stage.variant)."""
    values = {VARIANT_AXIS if k == "variant" else k: run.actual.get(k, v) for k, v in run.params.items()}
    return values | ({"trial": run.trial} if run.trial >= 0 else {})


def _stage_axes(choice: Chosen) -> StageAxes:
    """The columns a stage's own table groups by: the keys its runs vary (the seed last), its metric."""
    keys = list(dict.fromkeys(k for run in choice.runs for k in run.params))
    columns = [VARIANT_AXIS if k == "variant" else k for k in keys if k != "seed"]
    seeds = len({r.summary.details.get("seed") for r in choice.runs if r.summary}) > 1
    record = choice.record
    metric, search = (record.metric, record.search) if record else (None, False)
    metrics = tuple(record.metrics) if record else ()
    return StageAxes([*columns, *(["seed"] if seeds else [])], metric, search, metrics)


def paper_number(run_dir: str | Path, key: str, trained: int) -> int:
    """A run's `key` in the paper's numbers (its config.yaml's scale keeps them: d_model 256 for a run of 32 at
    scale=tiny), else `trained` (a CSV's, or a scale that maps nothing, are the paper's)."""
    try:
        cfg = OmegaConf.load(Path(run_dir) / CONFIG)
    except (OSError, ValueError):
        return trained
    return int(OmegaConf.select(cfg, "scale.paper", default={}).get(key, trained))


def _run_meta(stage: str, summary: RunSummary, run: StageRun, root: Path) -> dict[str, Any]:
    """The columns that identify a run, the stage reading it and its recipe, shared by all its rows. The stage is
    the one whose run set holds it (a run another stage trained keeps that stage's name in its summary)."""
    folder, details = run.folder, summary.details
    model, trainer = (_section(details, key, folder) for key in ("model", "trainer"))
    meta: dict[str, Any] = {
        "run": str(folder.relative_to(root)) if folder.is_relative_to(root) else str(folder),
        "run_id": run.run_id,
        "config": details.get("config_id"),  # runs from before config ids: their key columns (_normalise)
        "stage": stage,
        "label": folder.name if summary.label is None else summary.label,
        "variant": details.get("variant", "base"),
        "seed": details.get("seed"),
        "model": model.get("name", "cart"),
        **{k: model.get(k) for k in MODEL_KEYS},
        **{k: trainer.get(k) for k in RECIPE_KEYS},
        "run_dir": str(folder),
        FLOPS: _gflops(model, trainer),
        **shared(env if isinstance(env := details.get("env"), dict) else {}),
    }
    if details.get("stage_variant"):  # the stage's name for the run's variant (its ledger's, where it has one)
        meta[VARIANT_AXIS] = details["stage_variant"]
    if "eval_n_loops" in details:
        meta["eval_n_loops"] = details["eval_n_loops"]
        meta["trained_n_loops"] = details.get("trained_n_loops", model.get("n_loops"))
    if details.get("num_fewshot") is not None:  # a benchmark evaluation's shot count
        meta["num_fewshot"] = details["num_fewshot"]
    for key, value in meta.items():
        if value is not None and not isinstance(value, str | int | float):
            raise AnalysisError(f"{folder / SUMMARY}: {key} is {json.dumps(value)}, not a number or a word")
    return meta


def _gflops(model: dict[str, Any], trainer: dict[str, Any]) -> float | None:
    """A run's training GFLOPs per token (the model's formula, as `plan` costs runs) from what it records, an older
    record's missing setting at the schema's default; None where it records no size (pareto.py costs it)."""
    if any(k not in model for k in ("d_model", "head_dim", "vocab_size")) or "seq_len" not in trainer:
        return None
    known = {k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__}
    return train_flops_per_token(ModelConfig(**{"name": "cart", **known}), int(trainer["seq_len"])) / 1e9


def _section(details: dict[str, Any], key: str, folder: Path) -> dict[str, Any]:
    """A summary's `model` or `trainer` section: an object, or none."""
    value = details.get(key) or {}
    if not isinstance(value, dict):
        raise AnalysisError(f"{folder / SUMMARY}: {key} is {json.dumps(value)}, not an object of its settings")
    return value


def _scores(values: dict[str, Any]) -> dict[str, Any]:
    """The scalar results of an eval event, or of a summary's final numbers (RunSummary.results): ppl/bpb/ce per
    set, rho, counts, speed."""
    return {
        k: v
        for k, v in values.items()
        if k not in ("step", "kind") and (v is None or isinstance(v, int | float)) and not isinstance(v, bool)
    }


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Common types and defaults: stage as text, model lower-case, variant 'base', integer keys, a run key."""
    frame = frame.copy()
    frame["stage"] = frame["stage"].astype(str).str.strip()
    if "model" in frame:
        frame["model"] = frame["model"].astype(str).str.strip().str.lower()
    frame["variant"] = frame["variant"].fillna("base") if "variant" in frame else "base"
    for column in INT_COLUMNS:
        if column in frame:
            frame[column] = pd.to_numeric(frame[column], errors="coerce").round().astype("Int64")
    if "run" not in frame:  # a results CSV: a run is its row's key (and its run_id where the CSV has one)
        key = [c for c in RUN_KEY if c in frame]
        frame["run"] = _joined(frame, key)
        if "run_id" not in frame:
            frame["run_id"] = frame["run"]
    by_columns = _joined(frame, [c for c in (*CELL, *RECIPE_KEYS) if c in frame])
    frame["config"] = frame["config"].fillna(by_columns) if "config" in frame else by_columns
    return frame.reset_index(drop=True)


def _joined(frame: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Each row's values of `columns` as text joined by '|', column by column (a row-wise join takes minutes on a
    results CSV of a million rows)."""
    texts = [frame[c].map(str) for c in columns]
    return functools.reduce(lambda joined, text: joined + "|" + text, texts[1:], texts[0])
