"""`python -m cart_sweeps.analysis` (from a checkout also `python -m analysis`, the same package): regenerate
the study's tables, figures and findings from runs or a CSV."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .decisions import ALPHA
from .load import AnalysisError, load_csv, load_runs
from .registry import TABLES_DOC, readme_with_tables
from .report import run
from .select import left_line

CURRENT = "current"
OUT = Path("analysis/out")


def default_out(source: Path) -> Path:
    """A folder per input, named for it (runs -> analysis/out/runs, paper_results.csv -> .../paper_results), so
    analysing one input never replaces another's tables."""
    return OUT / (source.resolve().stem if source.suffix.lower() == ".csv" else source.resolve().name)


def launch_choice(text: str) -> int | None:
    """current (None: each cell's newest configuration), or a launch's number (1 = the first)."""
    if text == CURRENT:
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r}: use current or a launch number (1, 2, ...)")


def share(text: str, use: str) -> float:
    """A number strictly between 0 and 1, else `use` said."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: use {use}")
    return value


def error_rate(text: str) -> float:
    return share(text, "an error rate between 0 and 1, e.g. 0.05")


def margin_share(text: str) -> float:
    return share(text, "a relative margin between 0 and 1, e.g. 0.01 for 1%")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m cart_sweeps.analysis",
        description="Regenerate the CART study's tables (CSV, Markdown, LaTeX), figures (PNG), "
        "findings.json and a summary from run folders or a results CSV.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--runs", type=Path, metavar="DIR", help="run folders <DIR>/<stage>/<run>/ (default: $CART_SWEEPS_RUNS or runs)"
    )
    source.add_argument("--from-csv", type=Path, metavar="FILE", help="a results CSV, one row per run (and step)")
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"output folder (default: {OUT}/<input name>, e.g. {OUT}/runs, {OUT}/paper_results: one per input)",
    )
    parser.add_argument(
        "--metric",
        metavar="NAME",
        help="ranking metric: any metric with a record in cart_sweeps/metric.py, ranked in its direction "
        "(bench_<task>_acc highest first; default: ppl_wiki, else the first ppl_*)",
    )
    parser.add_argument(
        "--alpha",
        type=error_rate,
        default=ALPHA,
        metavar="A",
        help=f"error rate at which a claim is decided (default: {ALPHA}); see docs/statistics.md",
    )
    parser.add_argument(
        "--equivalence",
        type=margin_share,
        default=None,
        metavar="E",
        help="a relative margin (0.01: 1%%) within which options are decided equivalent, by two one-sided tests "
        "(default: a stage's own stage.equivalence, else none); see docs/statistics.md",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="build only these tables/figures (names, or the start of names: stage1, runs_adhoc, reversal) and "
        "rewrite only them, findings.json and report.md, keeping the rest of --out; one it cannot build is then "
        "an error (exit 2 where none is built, else 1)",
    )
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="table only runs whose recorded config has this value, e.g. trainer.lr=1e-3 model.d_model=32 "
        "(repeatable; run folders only)",
    )
    parser.add_argument(
        "--launch",
        type=launch_choice,
        default=None,
        metavar="WHICH",
        help="which runs of each stage to table: current (default: per table cell, the newest configuration "
        "launched for it, as plan and stage.select=zoom read them) or N, the runs launch N ran (1 = the first); "
        "run folders only",
    )
    parser.add_argument(
        "--decide",
        action="append",
        metavar="AXIS",
        help="decide only this axis of each stage that varies it, e.g. trainer.lr (repeatable; default: every "
        "axis of each stage with a seed axis, the others held fixed); see docs/decisions.md",
    )
    parser.add_argument(
        "--readme-tables",
        action="store_true",
        help="rewrite docs/results.md's list of the paper's tables from analysis/registry.py, then stop",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.readme_tables:
        TABLES_DOC.write_text(readme_with_tables(TABLES_DOC.read_text()))
        print(f"wrote {TABLES_DOC}")
        return 0
    source = args.from_csv or args.runs or Path(os.environ.get("CART_SWEEPS_RUNS", "runs"))
    try:
        if args.from_csv:
            if args.where or args.launch is not None:
                raise AnalysisError("--where and --launch choose among run folders; a results CSV is tabled whole")
            study = load_csv(source)
        else:
            study = load_runs(source, args.launch, args.where)
        if args.equivalence is not None:  # the analysis's margin for every stage's claims
            study.evals["equivalence"] = args.equivalence
        report = run(study, args.out or default_out(source), args.metric, args.only, args.alpha, args.decide)
    except AnalysisError as error:
        print(f"analysis: {error}", file=sys.stderr)
        return 2
    for path in report.written:
        print(f"wrote {path}")
    for stage, why in study.unread.items():
        print(f"left out stage {stage}: {why}")
    for name, reason in report.skipped.items():
        print(f"skipped {name}: {reason}")
    if (absent := report.absent_line()) is not None:
        print(absent)
    for chosen in study.selection.values():
        print("\n".join([chosen.line(), *(f"  {line}" for line in chosen.details())]))
    for left_out in report.left_out:
        print(left_line(left_out))
    print()
    print(report.summary)
    for line in report.asked:
        print(f"analysis: {line}", file=sys.stderr)
    return 1 if report.asked else 0


if __name__ == "__main__":
    sys.exit(main())
