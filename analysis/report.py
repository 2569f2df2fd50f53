"""Build every table and figure the inputs allow, write them with findings.json and report.md to one
folder, and say in words what came out. Same inputs, same files: safe to rerun."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from cart_sweeps.stagerecord.runset import LeftOut

from . import ladder, pareto, recipe, search, stage_decisions, stage_tables, throughput
from .csv_input import ROW
from .decisions import ALPHA, Decision
from .figures import figure_jobs
from .findings import MEASURED_WITH, Findings, listed, words
from .load import ASKED, AnalysisError, Study, pick_metric, unreadable
from .output import replacing
from .registry import TABLES, check_roles, findings
from .render import framed, write_table
from .select import left_line, unmeasured


@dataclass
class Report:
    """What a run of the analysis wrote, what it could not build (and why), and what it found."""

    written: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    findings: Findings = field(default_factory=dict)
    summary: str = ""
    left_out: list[LeftOut] = field(default_factory=list)  # rows and runs the tables leave out (Study.left_out)
    absent: list[str] = field(default_factory=list)  # the paper's tables and figures no stage's role feeds: unbuilt
    asked: list[str] = field(default_factory=list)  # what --only or --decide asked for and did not get, a line each

    def absent_line(self) -> str | None:
        """One line for the paper's tables a study of one's own stages does not feed (not one line each)."""
        if not self.absent:
            return None
        return (
            f"{len(self.absent)} of the paper's tables and figures not built: no stage in the input takes the role "
            "they read (a stage file's `role:`, docs/results.md)"
        )


def _selected(names: list[str], only: list[str] | None, unread: dict[str, str]) -> tuple[list[str], list[str]]:
    """The names `only` asks for (a name, or any prefix of names: 'stage1', 'runs_adhoc'), all of them without
    `only`; and a line for each name asked of a stage the analysis could not read (`unread`)."""
    if not only:
        return names, []
    lost = []
    for wanted in only:
        if any(n.startswith(wanted) for n in names):
            continue
        if left := [s for s in unread if s in wanted]:
            lost += [f"--only {wanted}: stage {s} is left out ({unread[s]})" for s in left]
            continue
        raise AnalysisError(f"--only {wanted}: no such table or figure (have: {', '.join(names)})")
    return [n for n in names if any(n.startswith(w) for w in only)], lost


def run(
    study: Study,
    out: Path,
    metric: str | None = None,
    only: list[str] | None = None,
    alpha: float = ALPHA,
    decide_axes: list[str] | None = None,
) -> Report:
    """Tables, figures, findings.json and report.md under `out`, written whole or not at all (analysis.output).
    What cannot be built is skipped with its reason and the rest written (with `only`: also a line in
    Report.asked, and an error where none is built); runs without a measurement of the metric are listed first."""
    check_roles()
    first = _final(study)
    metric, why = pick_metric(first, metric)
    note = stage_tables.ranking_line(study, first, metric, why)
    if why == ASKED:  # --metric ranks every table, a stage's own too, over its sweep.metric
        study = replace(study, axes={stage: replace(axes, metric=None) for stage, axes in study.axes.items()})
    every = study.final()  # claims see each run that exists, so an option without a valid value is said
    study = _measured(study, metric)
    final = _final(study)
    figures = figure_jobs(study, metric) | search.search_jobs(study, metric) | ladder.figure_jobs(study, metric)
    figures |= pareto.figure_jobs(study, metric)
    own = stage_tables.names(study)

    def study_tables(of: Study) -> dict[str, Callable[[], pd.DataFrame]]:
        """The tables a ladder or a stage of several objectives adds, built from `of`."""
        return ladder.table_jobs(of, metric, alpha) | pareto.table_jobs(of)

    ladders = study_tables(study)
    chosen, lost = _selected([*TABLES, *own, *ladders, *figures], only, study.unread)
    report, tables = Report(left_out=study.left_out, asked=[*lost]), {}
    shown: dict[str, str] = {}  # a table -> its Markdown, as its .md file and report.md show it
    if not only:  # a paper table whose roles no stage takes is not attempted: the study is one's own
        taken = set(final["role"].dropna())
        report.absent = [n for n, roles in _paper_reads().items() if not set(roles) & taken]
        chosen = [n for n in chosen if n not in report.absent]
    decisions: list[Decision] = []
    split: dict[str, list[str]] = {}  # a table built per recipe (analysis.recipe) -> its recipe columns
    decidable = {s: stage_decisions.decidable(every[every["stage"] == s], a) for s, a in study.axes.items()}
    stage_decisions.check_asked(decide_axes, decidable, study.unread)
    own_decisions: dict[str, list[dict[str, object]]] = {}
    with replacing(out, keep=bool(only)) as folder:
        for name in chosen:
            try:
                if name in figures:
                    report.written += figures[name](folder / name)
                    continue

                def build(part: recipe.Part, name: str = name) -> pd.DataFrame:
                    """The table from the runs of one recipe (analysis.recipe)."""
                    if name in ladders:
                        return study_tables(part.study(study))[name]()
                    if name in own:
                        stage = stage_tables.stage_of(name)
                        table = stage_tables.stage_table(part.rows(final), stage, study.axes[stage], metric)
                        made = stage_decisions.decide_stage(
                            part.rows(every), stage, study.axes[stage], metric, alpha, decide_axes
                        )
                        made = [(replace(d, cell={**d.cell, **part.values}), edge) for d, edge in made]
                        rows = part.rows(final).query("stage == @stage")
                        noise = throughput.note(rows, [stage_tables.stage_metric(rows, study.axes[stage], metric)])
                        own_decisions.setdefault(stage, []).extend(
                            stage_decisions.as_json(*pair, noise) for pair in made
                        )
                        return stage_decisions.mark(table, made)
                    table, claims = TABLES[name].decide(
                        TABLES[name].of(part.study(study), part.rows(final), metric), part.rows(every), metric, alpha
                    )
                    decisions.extend(replace(c, cell={**c.cell, **part.values}) for c in claims)
                    return table

                pieces = recipe.parts(study, stages_read(final, name))
                tables[name], failed = recipe.apart(pieces, build)
                if pieces[0].values:
                    split[name] = list(pieces[0].values)
                report.skipped.update({f"{name} ({label})": why for label, why in failed.items()})
                caption = TABLES[name].caption if name in TABLES else None
                shows = [metric] if name in TABLES and TABLES[name].shows_metric else []
                under = throughput.note(final[final["stage"].isin(stages_read(final, name))], [*tables[name], *shows])
                if name in own and (mean := stage_tables.mean_note(tables[name])):
                    under = f"{under}. {mean}" if under else mean
                shown[name] = framed(tables[name], metric, runs_used(study, name), under)
                report.written += write_table(tables[name], folder, name, shown[name], metric, caption)
            except Exception as error:  # noqa: BLE001 (one output that cannot be built is said, the others written)
                report.skipped[name] = _why(study, final, name, error)
        report.asked += _asked_missing(study, report.skipped, only and chosen, decide_axes)
        if only and set(chosen) <= set(report.skipped):  # nothing asked for could be built: nothing written
            raise AnalysisError(lost[0] if lost else report.skipped[chosen[0]])
        selection = {"selection": {s: asdict(c) for s, c in study.selection.items()}} if study.selection else {}
        whole = {n: t for n, t in tables.items() if n not in split}  # a split table's rows are no one finding
        best = stage_tables.best_rows({n: t for n, t in whole.items() if n in own})
        findings_ = findings(whole, metric, decisions)
        report.findings = {"input": _input(study, final), **selection, **findings_, "stages": best}
        if own_decisions := {s: made for s, made in own_decisions.items() if made}:
            report.findings["stage_decisions"] = own_decisions
        by_stage = final.groupby("stage")
        if beside := {s: line for s, rows in by_stage if (line := throughput.note(rows, [metric]))}:
            report.findings[MEASURED_WITH] = beside
        notes, roles = _notes(study, note, report.skipped, split, report.absent_line()), _roles(final)
        report.summary = words(report.findings, notes, roles)
        (folder / "findings.json").write_text(json.dumps(report.findings, indent=2) + "\n")
        listed_ = listed(report.findings, notes, roles)
        (folder / "report.md").write_text(_markdown_report(shown, report, study, _title(final), listed_))
        report.written += [folder / "findings.json", folder / "report.md"]
    report.written = [out / p.name for p in report.written]
    return report


def _why(study: Study, final: pd.DataFrame, name: str, error: Exception) -> str:
    """Why `name` was not built: the input's lack, in the analysis's words; otherwise the stages it reads and
    the error, so that a stage the analysis cannot handle is named."""
    if isinstance(error, AnalysisError):
        return str(error)
    stages = ", ".join(_stages_of(study, final, name))
    return f"{'stage ' + stages + ': ' if stages else ''}cannot be built ({unreadable(error)})"


def _stages_of(study: Study, final: pd.DataFrame, name: str) -> list[str]:
    """The stages whose runs an output reads (a figure of one stage's training log: that stage)."""
    if name in TABLES or _own_stage(name) is not None:
        return stages_read(final, name)
    kind, _, of = name.partition("_")
    return [s for s in study.axes if of in (s, f"stage{s}")] if kind in ("loss", "rho", "search") else []


def _asked_missing(
    study: Study, skipped: dict[str, str], asked: list[str] | None, decide_axes: list[str] | None
) -> list[str]:
    """A line for each output --only asked for that was not built, and for each stage whose decision of an axis
    --decide names was lost with its table."""
    lines = [f"--only: {name} not built: {skipped[name]}" for name in asked or [] if name in skipped]
    for name, why in skipped.items():
        stage = stage_tables.stage_of(name) if name.startswith(stage_tables.PREFIX) else None
        if decide_axes and stage in study.axes and stage_decisions.wanted_axes(study.axes[stage].columns, decide_axes):
            lines.append(f"--decide: stage {stage} not decided: {why}")
    return lines


def _paper_reads() -> dict[str, tuple[str, ...]]:
    """The roles each paper table and figure reads (a figure: the table it draws)."""
    drawn = {"stage1_ppl_vs_R": "stage1_grid", "screen_vs_step": "screen_agreement"}
    return {name: table.reads for name, table in TABLES.items()} | {f: TABLES[t].reads for f, t in drawn.items()}


def _final(study: Study) -> pd.DataFrame:
    """The last evaluation of every run; none is an error naming what was left out."""
    final = study.final()
    if final.empty:
        left = ", ".join(f"{n} {s}" for s, n in study.not_completed.items()) or "none"
        raise AnalysisError(f"no completed runs in {study.source} (left out: {left})")
    return final


def _measured(study: Study, metric: str) -> Study:
    """The study less the runs whose last evaluation holds no measurement of `metric` (missing, not finite, out of
    its range): listed and counted, so that no table ranks by a gap or an impossible value."""
    final = study.final()
    if not pd.api.types.is_numeric_dtype(final[metric]):
        raise AnalysisError(f"--metric {metric}: not a column of numbers")
    faults = {
        run: (f"no {metric}", f"no {metric}, the ranking metric") if pd.isna(value) else unmeasured(metric, value)
        for run, value in zip(final["run"], final[metric], strict=True)
    }
    faults = {run: fault for run, fault in faults.items() if fault[1]}
    if not faults:
        return study
    places = final[ROW] if ROW in final else final["run"]
    listed = {o.run for o in study.left_out}  # a CSV value blanked as no measurement: listed and counted once
    fresh = {
        run: place for run, place in zip(final["run"], places, strict=True) if run in faults and place not in listed
    }
    left_out = [LeftOut(place, place, *faults[run]) for run, place in fresh.items()]
    counts = Counter(study.not_completed)
    counts.update(faults[run][0] for run in fresh)
    kept = recipe.Part(dropped=frozenset(faults)).study(study)
    return replace(kept, not_completed=dict(counts), left_out=[*study.left_out, *left_out])


def runs_used(study: Study, table: str) -> str:
    """The line saying which runs a table used (empty without a selection: a results CSV)."""
    if (own := _own_stage(table)) is not None:
        chosen = [study.selection[own]] if own in study.selection else []
    else:
        chosen = [c for c in study.selection.values() if c.role in TABLES[table].reads]
    lines = [c.line() for c in chosen]
    return f"Runs: {'; '.join(lines)}." if lines else ""


def _own_stage(table: str) -> str | None:
    """The one stage a stage's own table, a ladder's or a Pareto table is of (None: a paper table)."""
    if table.startswith(stage_tables.PREFIX):
        return stage_tables.stage_of(table)
    return ladder.stage_of(table) or pareto.stage_of(table)


def stages_read(final: pd.DataFrame, table: str) -> list[str]:
    """The stages whose runs `table` reads: its own stage's (a stage's table, a ladder's), else its roles'."""
    if (own := _own_stage(table)) is not None:
        return [own]
    return sorted(final.loc[final["role"].isin(TABLES[table].reads), "stage"].unique()) if "role" in final else []


def _input(study: Study, final: pd.DataFrame) -> Findings:
    """Where the results came from and how many runs entered the tables."""
    stages = final["stage"].value_counts().sort_index()
    return {
        "source": study.source,
        "runs": len(final),
        "runs_per_stage": {s: int(n) for s, n in stages.items()},
        "not_completed": study.not_completed,
        "left_out": [{"where": o.run, "kind": o.kind, "reason": o.reason} for o in study.left_out],
        "stages_left_out": study.unread,
    }


def _notes(
    study: Study, metric_note: str | None, skipped: dict[str, str], split: dict[str, list[str]], absent: str | None
) -> list[str]:
    """The caveats the closing paragraph must carry."""
    notes = [metric_note] if metric_note else []
    if study.not_completed:
        left = ", ".join(f"{n} {status}" for status, n in study.not_completed.items())
        notes.append(f"Runs left out of the tables: {left}{' (listed in report.md)' * bool(study.left_out)}.")
    for chosen in study.selection.values():
        if chosen.excluded or chosen.missing:
            why = Counter(e.kind for e in chosen.excluded)
            left = ", ".join(f"{n} {reason}" for reason, n in why.items()) or "none"
            gone = f"; {len(chosen.missing)} missing" if chosen.missing else ""
            notes.append(f"Stage {chosen.stage} tables use {chosen.basis}; left out: {left}{gone} (see report.md).")
    if study.unread:
        left = ", ".join(study.unread)
        notes.append(f"Stages left out, the analysis could not read them: {left} (findings.json's input says why).")
    if skipped:
        notes.append(f"Not built: {', '.join(skipped)} (the command's output says why).")
    if absent:
        notes.append(f"{absent}.")
    if split:
        keys = ", ".join(dict.fromkeys(k for columns in split.values() for k in columns))
        notes.append(
            f"Runs of different recipes ({keys}) are tabled apart, a row per recipe, in {', '.join(split)}; "
            "findings.json draws no finding across them."
        )
    return notes


def _title(final: pd.DataFrame) -> str:
    """What the report is of: the CART study where a stage takes one of the paper's roles, else the stages read."""
    if "role" in final and final["role"].notna().any():
        return "CART study"
    stages = sorted(map(str, final["stage"].unique())) if "stage" in final else []
    return f"Stage{'s' if len(stages) > 1 else ''} {', '.join(stages)}" if stages else "Study"


def _roles(final: pd.DataFrame) -> dict[str, str]:
    """Role -> the stage playing it, so each finding is listed under its stage."""
    if "role" not in final:
        return {}
    return {r: s for r, s in zip(final["role"], final["stage"], strict=True) if isinstance(r, str)}


def _markdown_report(shown: dict[str, str], report: Report, study: Study, title: str, findings_: str) -> str:
    """The findings first, one per line under their stage (`findings_`), then the runs used and every table and
    figure on one page."""
    parts = [f"# {title}: regenerated tables\n", f"## Findings\n\n{findings_}"]
    if study.selection:
        lines = [f"- {c.line()}" + "".join(f"\n  - {d}" for d in c.details()) for c in study.selection.values()]
        parts.append("## Runs used\n\n" + "\n".join(lines) + "\n")
    if study.left_out:
        parts.append("## Left out\n\n" + "\n".join(f"- {left_line(o)}" for o in study.left_out) + "\n")
    parts += [f"## {name}\n\n{text}" for name, text in shown.items()]
    parts += [f"![{p.stem}]({p.name})\n" for p in report.written if p.suffix == ".png"]
    return "\n".join(parts)
