"""Turn run folders or a results CSV into one tidy frame of evaluations (one row per run and step).

Both inputs land in the same columns (stage, model, variant, d_model, n_prelude, n_loops, n_layers,
seed, step, ppl_<set>, bpb_<set>, ce_<set>, rho, trainer recipe, ...), so every table reads one shape.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cart_sweeps.status import RunStatus
from cart_sweeps.summary import RunSummary

INT_COLUMNS = (
    "d_model",
    "n_prelude",
    "n_loops",
    "n_layers",
    "seed",
    "step",
    "eval_n_loops",
    "trained_n_loops",
    "steps",
    "warmup_steps",
)
RUN_KEY = ("stage", "model", "variant", "d_model", "n_prelude", "n_loops", "n_layers", "seed", "eval_n_loops")
TRAINER_KEYS = ("steps", "lr", "min_lr", "warmup_steps", "weight_decay", "decay_all")
MODEL_KEYS = ("d_model", "n_prelude", "n_loops", "n_layers")
TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens", "rho", "tokens_per_s")


CELL = ("model", "variant", "d_model", "n_prelude", "n_loops", "n_layers", "eval_n_loops", "num_fewshot")  # per stage


class AnalysisError(ValueError):
    """A problem with the input the user can fix; shown as one line, not a traceback."""


@dataclass(frozen=True)
class RunRecord:
    """One run folder as its summary.json describes it: what `analysis.select` chooses runs by."""

    run: str  # the folder, relative to the runs root (the `run` column of the frames)
    stage: str
    label: str
    run_id: str | None
    status: str
    seed: int | None
    config: dict[str, Any]  # the recorded config, flat (model.*, trainer.*, data, eval_n_loops), without the seed
    config_id: str | None  # the summary's own (runs since config_id existed); None for older summaries
    cell: tuple[Any, ...]  # the table cell it falls in: CELL's values
    written: float  # when its summary was written (seconds since the epoch)


@dataclass
class Study:
    """Everything analysis reads: evaluations, the training log, the runs left out, and (from run
    folders) every run read, and which of them each stage's tables use and why."""

    evals: pd.DataFrame
    train: pd.DataFrame = field(default_factory=pd.DataFrame)
    not_completed: dict[str, int] = field(default_factory=dict)
    source: str = ""
    records: list[RunRecord] = field(default_factory=list)
    selection: dict[str, Any] = field(default_factory=dict)  # stage -> analysis.select.StageSelection

    def final(self) -> pd.DataFrame:
        """The last evaluated step of every run: what the tables rank ("at the last step")."""
        ev = self.evals
        if ev.empty:
            return ev
        if "step" in ev:
            ev = ev.sort_values("step", kind="stable", na_position="first")
        return ev.groupby("run", sort=False, dropna=False).tail(1).reset_index(drop=True)


def require(rows: pd.DataFrame, columns: list[str], table: str) -> None:
    """Fail in one line naming the first column `table` needs that these rows lack (absent or all empty)."""
    for column in columns:
        if column not in rows.columns:
            raise AnalysisError(f"table {table!r} needs column {column!r}, which the input lacks")
        if rows[column].isna().all():
            raise AnalysisError(f"table {table!r} needs column {column!r}, which is empty for the runs it reads")


def ppl_sets(rows: pd.DataFrame) -> list[str]:
    """The ppl_<set> columns holding data, sorted (the validation sets these rows were scored on)."""
    return sorted(c for c in rows.columns if c.startswith("ppl_") and rows[c].notna().any())


def bench_sets(rows: pd.DataFrame) -> list[str]:
    """The bench_<task>_<metric> columns holding data, sorted (lm-eval tasks these rows were scored on)."""
    return sorted(c for c in rows.columns if c.startswith("bench_") and rows[c].notna().any())


def pick_metric(rows: pd.DataFrame, requested: str | None) -> tuple[str, str | None]:
    """The ranking metric and, when it is a fallback, a sentence saying so.

    The paper ranks by ppl_wiki; corpora without a wiki set (the embedded one) fall back to the first
    ppl_* column in sorted order.
    """
    if requested:
        if requested not in rows.columns:
            raise AnalysisError(f"--metric {requested}: no such column (have: {', '.join(ppl_sets(rows))})")
        return requested, None
    sets = ppl_sets(rows)
    if "ppl_wiki" in sets:
        return "ppl_wiki", None
    if not sets:
        raise AnalysisError("the input has no ppl_<set> column to rank runs by")
    return sets[0], f"Ranking metric: {sets[0]}, since ppl_wiki is absent (the first ppl_* column in sorted order)."


def load_csv(path: str | Path) -> Study:
    """A results CSV (one row per run, or per run and step); rows with a status other than completed are left out."""
    path = Path(path)
    if not path.is_file():
        raise AnalysisError(f"--from-csv {path}: no such file")
    frame = pd.read_csv(path, dtype={"stage": str, "model": str, "variant": str})
    if "stage" not in frame:
        raise AnalysisError(f"{path}: needs a 'stage' column (values 1, 2, parity, ablations, variable_r)")
    left_out: Counter[str] = Counter()
    if "status" in frame:
        done = frame["status"].fillna(RunStatus.COMPLETED) == RunStatus.COMPLETED
        left_out.update(frame.loc[~done, "status"].astype(str))
        frame = frame[done]
    return Study(evals=_normalise(frame), not_completed=dict(left_out), source=str(path))


def load_runs(root: str | Path) -> Study:
    """Every run folder under `root` (`<root>/<stage>/<run>/summary.json` + metrics.jsonl).

    Robust to what real sweeps leave behind: runs still going, failed or diverged (counted, not
    tabled), unreadable summaries, a metrics.jsonl cut off mid-line, extra nesting.
    """
    root = Path(root)
    summaries = sorted(root.rglob("summary.json")) if root.is_dir() else []
    if not summaries:
        raise AnalysisError(
            f"no run folders under {root} (expected {root}/<stage>/<run>/summary.json); "
            "pass --runs DIR or --from-csv FILE"
        )
    evals: list[dict[str, Any]] = []
    train: list[dict[str, Any]] = []
    records: list[RunRecord] = []
    left_out: Counter[str] = Counter()
    for path in summaries:
        try:
            summary = json.loads(path.read_text())
            written = path.stat().st_mtime
        except (OSError, json.JSONDecodeError):
            left_out["unreadable"] += 1
            continue
        status = str(RunSummary.from_dict(summary).status)  # a status it does not know reads as failed
        meta = _run_meta(summary, path.parent, root)
        records.append(_record(summary, meta, status, written))
        if status != RunStatus.COMPLETED:
            left_out[status] += 1
            continue
        for event in _events(path.parent / "metrics.jsonl"):
            if event.get("kind") == "train":
                train.append({**meta, "step": event.get("step"), **{k: event.get(k) for k in TRAIN_KEYS}})
            elif event.get("kind") == "eval":
                evals.append({**meta, "step": event.get("step"), **_scores(event)})
        evals.append({**meta, **_scores(summary), "step": summary.get("step"), "run_id": summary.get("run_id")})
    study_evals = _normalise(pd.DataFrame(evals)) if evals else pd.DataFrame()
    if not study_evals.empty:
        study_evals = study_evals.drop_duplicates(["run", "step"], keep="last").reset_index(drop=True)
    study_train = _normalise(pd.DataFrame(train)) if train else pd.DataFrame()
    return Study(study_evals, study_train, dict(sorted(left_out.items())), str(root), records)


def _record(summary: dict[str, Any], meta: dict[str, Any], status: str, written: float) -> RunRecord:
    """A run's record: its identity, its recorded config (flat), its cell."""
    config = {f"{group}.{k}": v for group in ("model", "trainer") for k, v in (summary.get(group) or {}).items()}
    config["data"] = summary.get("data")
    if "eval_n_loops" in summary:
        config["eval_n_loops"] = summary["eval_n_loops"]
    return RunRecord(
        run=meta["run"],
        stage=meta["stage"],
        label=meta["label"],
        run_id=summary.get("run_id"),
        status=status,
        seed=summary.get("seed"),
        config=config,
        config_id=summary.get("config_id"),
        cell=tuple(meta.get(k) for k in CELL),
        written=written,
    )


def _run_meta(summary: dict[str, Any], folder: Path, root: Path) -> dict[str, Any]:
    """The columns that identify a run and its recipe, shared by all its rows."""
    model = summary.get("model") or {}
    trainer = summary.get("trainer") or {}
    relative = folder.relative_to(root)
    meta: dict[str, Any] = {
        "run": str(relative),
        "stage": str(summary.get("stage") or relative.parts[0]),
        "label": summary.get("label", folder.name),
        "variant": summary.get("variant", "base"),
        "seed": summary.get("seed"),
        "model": model.get("name", "cart"),
        **{k: model.get(k) for k in MODEL_KEYS},
        **{k: trainer.get(k) for k in TRAINER_KEYS},
        "run_dir": str(folder),
    }
    if "eval_n_loops" in summary:
        meta["eval_n_loops"] = summary["eval_n_loops"]
        meta["trained_n_loops"] = summary.get("trained_n_loops", model.get("n_loops"))
    if summary.get("num_fewshot") is not None:  # a benchmark evaluation's shot count
        meta["num_fewshot"] = summary["num_fewshot"]
    return meta


def _scores(record: dict[str, Any]) -> dict[str, Any]:
    """The scalar results of a summary or eval event (ppl/bpb/ce per set, rho, counts, speed)."""
    skip = {"status", "stage", "run_id", "label", "variant", "seed", "step", "kind", "eval_n_loops", "trained_n_loops"}
    skip.add("num_fewshot")  # in the run's meta
    return {
        k: v
        for k, v in record.items()
        if k not in skip and (v is None or isinstance(v, int | float)) and not isinstance(v, bool)
    }


def _events(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl events; blank or torn lines (a run cut off mid-write) are skipped."""
    if not path.is_file():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


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
    if "run" not in frame:
        key = [c for c in RUN_KEY if c in frame]
        frame["run"] = frame[key].map(str).agg("|".join, axis=1)
    return frame.reset_index(drop=True)
