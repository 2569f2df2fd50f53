"""The paper's tables, one record each in one registry: what the report (analysis/report.py) and a stage's
dashboard (cart_sweeps/dashboard.py) build, from which stages' runs, and what each says in its caption.

A new paper table is its record here (its builder may live in any analysis module); docs/results.md lists them
between its `tables` markers, written from this list by `python -m cart_sweeps.analysis --readme-tables`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import claims as claim
from . import findings as found
from . import pareto, promotion, screen, tables
from .decisions import Decision
from .findings import Findings
from .load import AnalysisError, Study
from .stages import ABLATIONS, BENCHMARKS, CONFIRM, PARITY, SCREEN, VARIABLE_R, shipped_roles

# A table's findings: (its section's key in findings.json, the hook that reads it off the built tables by name).
Section = tuple[str, Callable[[dict[str, pd.DataFrame], str], Findings]]


@dataclass(frozen=True)
class Table:
    reads: tuple[str, ...]  # the roles of the stages whose runs it reads (its "Runs:" line, a dashboard's tables)
    build: Callable[[pd.DataFrame, str], pd.DataFrame]  # (rows, ranking metric) -> the table
    caption: str | None = None  # what it shows, in a sentence (None: its name); its metric is named in its headers
    every_step: bool = False  # built from every evaluation (Study.evals), not from each run's last (Study.final())
    findings: Section | None = None  # what findings.json says of it (present only where its tables were built)
    claims: claim.Claims | None = None  # the claims it makes (findings.json's decisions), from its columns
    mark: claim.Mark | None = None  # how it carries them: columns it adds (decided, verdict, ...)
    # its numbers are, or rank by, the ranking metric's (named in its headers or not): where that is a throughput
    # measured beside other runs, a line under it says so (analysis.throughput); False: it shows other numbers
    shows_metric: bool = True

    def __post_init__(self) -> None:
        if self.mark is not None and self.claims is None:
            raise ValueError("a table's mark carries its claims: give it claims too")

    def of(self, study: Study, final: pd.DataFrame, metric: str) -> pd.DataFrame:
        """The table from `study` (`final`: its runs' last evaluations, computed once by the caller)."""
        return self.build(study.evals if self.every_step else final, metric)

    def decide(
        self, table: pd.DataFrame, final: pd.DataFrame, metric: str, alpha: float
    ) -> tuple[pd.DataFrame, list[Decision]]:
        """Its claims over `final` (every run's last row) and the table with their marks."""
        return claim.decide(self.claims, self.mark, table, final, metric, alpha)


TABLES: dict[str, Table] = {
    "stage1_grid": Table(
        reads=(SCREEN,),
        build=tables.stage1_grid,
        caption="Stage 1 (screen): the ranking metric at the last step for every width $d$, prelude depth "
        "$P$ and loop count $R$.",
    ),
    "stage1_best": Table(
        reads=(SCREEN,),
        build=tables.stage1_best,
        caption="Stage 1: the best $(P, R)$ per width, handed to Stage 2.",
        findings=("stage1", found.stage1),
        claims=claim.SCREEN_BEST,
        mark=claim.MARK_BEST,
    ),
    "stage1_r_benefit": Table(
        reads=(SCREEN,),
        build=tables.stage1_r_benefit,
        caption="Stage 1: change of the metric from the smallest to the largest $R$ at the best $P$.",
    ),
    "stage1_p_ordering": Table(
        reads=(SCREEN,),
        build=tables.stage1_p_ordering,
        caption="Stage 1: whether the ranking of prelude depths $P$ holds at every $R$ and width.",
        claims=claim.P_ORDERING,
        mark=claim.MARK_ORDERING,
    ),
    "stage1_variance": Table(
        reads=(SCREEN,),
        build=tables.stage1_variance,
        caption="Stage 1: share of the variance of the log-metric explained by $P$ and $R$.",
    ),
    "stage1_compute_front": Table(
        reads=(SCREEN,),
        build=pareto.stage1_compute_front,
        caption="Stage 1: per width, the $(P, R)$ no cell of as little training compute (FLOPs per token) beats.",
    ),
    "stage2_seeds": Table(
        reads=(CONFIRM,),
        build=tables.stage2_seeds,
        caption="Stage 2: mean and standard deviation over seeds of each full-length run.",
    ),
    "stage2_best": Table(
        reads=(CONFIRM,),
        build=tables.stage2_best,
        caption="Stage 2: the best $R$ per width (mean over seeds).",
        findings=("stage2", found.stage2),
        claims=claim.CONFIRM_BEST,
        mark=claim.MARK_BEST,
    ),
    "reversal": Table(
        reads=(SCREEN, CONFIRM),
        build=tables.reversal,
        caption="Whether Stage 2 reverses or confirms Stage 1's choice of $R$, tested over Stage 2's seeds.",
        findings=("reversal", found.reversal),
        claims=claim.REVERSAL,
        mark=claim.MARK_REVERSAL,
    ),
    "reversal_cells": Table(
        reads=(SCREEN, CONFIRM),
        build=tables.reversal_cells,
        caption="The configurations both stages trained: Stage 1's metric against Stage 2's.",
    ),
    "parity": Table(
        reads=(PARITY, CONFIRM),
        build=tables.parity,
        caption="Dense baselines at parameter parity with CART (stored and effective parameters).",
        findings=("parity", found.parity),
        claims=claim.PARITY_SIDE,
        mark=claim.MARK_PARITY,
        shows_metric=False,
    ),
    "ablations": Table(
        reads=(ABLATIONS, CONFIRM, PARITY),
        build=tables.ablations,
        caption="Ablations against the base model, with the seed noise of the base.",
        findings=("ablations", found.ablations),
        claims=claim.ABLATION,
        mark=claim.MARK_ABLATION,
        shows_metric=False,
    ),
    "variable_r": Table(
        reads=(VARIABLE_R,),
        build=tables.variable_r,
        caption="The metric at inference loop counts $R$ other than the trained one.",
        findings=("variable_r", found.variable_r),
        claims=claim.TRAINED_R_BEST,
        shows_metric=False,
    ),
    "variable_r_bench": Table(
        reads=(VARIABLE_R,),
        build=tables.variable_r_bench,
        findings=("variable_r_bench", found.variable_r_bench),
        shows_metric=False,
    ),
    "benchmarks": Table(
        reads=(BENCHMARKS,),
        build=tables.benchmarks,
        shows_metric=False,
    ),
    "rho": Table(
        reads=(SCREEN, CONFIRM, PARITY),
        build=tables.rho,
        caption="Final gate $\\rho$ against the value weight decay alone predicts.",
        findings=("rho", found.rho),
        shows_metric=False,
    ),
    "screen_agreement": Table(
        reads=(SCREEN, CONFIRM, PARITY, ABLATIONS, VARIABLE_R),
        build=screen.screen_agreement,
        caption="Agreement of each evaluation step's ranking with the final ranking, per stage and width.",
        every_step=True,
        findings=("screen", found.screen),
    ),
    "screen_transfer": Table(
        reads=(SCREEN, CONFIRM),
        build=screen.screen_transfer,
        caption="Stage 1's final ranking against Stage 2's, at the matching step and at the end.",
        every_step=True,
    ),
    "screen_promotion": Table(
        reads=(SCREEN, CONFIRM),
        build=promotion.screen_promotion,
        caption="The promotion audit: per width, Stage 2's winner and its screen rank, whether the zoom's rule "
        "(the zoom stage's own) promoted it, and the pairwise agreement of the two stages' rankings with a bootstrap "
        "interval.",
        every_step=True,  # it takes each run's last evaluation itself
    ),
}


def findings(built: dict[str, pd.DataFrame], metric: str, decisions: list[Decision]) -> Findings:
    """Each table's findings section, in the registry's order; a section is present only where its tables are.
    `decisions` holds one record per claim the words make (analysis.claims), how sure each is."""
    out: Findings = {"metric": metric}
    for table in TABLES.values():
        if table.findings and (part := table.findings[1](built, metric)):
            out[table.findings[0]] = part
    if decisions:
        out["decisions"] = [d.as_json() for d in decisions]
    return out


def check_roles() -> None:
    """A stage file's role that no table reads (a misspelt or forgotten one) is one line: its runs would be in
    no paper table."""
    read = {role for table in TABLES.values() for role in table.reads}
    for stage, role in shipped_roles().items():
        if role not in read:
            raise AnalysisError(
                f"stage {stage} claims role: {role}, which no table reads; fix its role, or give a table in "
                "analysis/registry.py reads=(its role,)"
            )


TABLES_DOC = Path(__file__).resolve().parents[1] / "docs" / "results.md"  # where the list of tables lives
README_START = "<!-- tables:start (python -m cart_sweeps.analysis --readme-tables) -->"
README_END = "<!-- tables:end -->"


def readme_tables() -> str:
    """The list of the paper's tables (docs/results.md): name, the roles of the stages it reads, caption."""
    rows = ["| table | reads the stages of role | caption |", "| --- | --- | --- |"]
    for name, table in TABLES.items():
        rows.append(f"| `{name}` | {', '.join(table.reads)} | {table.caption or '(its name)'} |")
    return "\n".join(rows)


def readme_with_tables(text: str) -> str:
    """`text` (docs/results.md) with the block between its markers rewritten from TABLES."""
    head, _, rest = text.partition(README_START)
    _, _, tail = rest.partition(README_END)
    return f"{head}{README_START}\n{readme_tables()}\n{README_END}{tail}"
