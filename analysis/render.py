"""Write a table as CSV, Markdown and LaTeX (own tiny writers: no tabulate or jinja2 needed)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "_": r"\_",
    "%": r"\%",
    "&": r"\&",
    "#": r"\#",
    "$": r"\$",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def cell(value: object) -> str:
    """One value as text: 5 significant digits, yes/no for booleans, empty for missing."""
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float | np.floating):
        return f"{value:.5g}"
    return str(value)


def _numeric(table: pd.DataFrame) -> list[bool]:
    """Which columns hold numbers (right-aligned)."""
    return [pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t) for t in table.dtypes]


def markdown(table: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table."""
    rule = ["---:" if n else "---" for n in _numeric(table)]
    body = ([cell(v).replace("|", r"\|") for v in row] for row in table.itertuples(False))
    lines = [list(map(str, table.columns)), rule, *body]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


def latex(table: pd.DataFrame) -> str:
    """A booktabs tabular (needs \\usepackage{booktabs})."""
    spec = "".join("r" if n else "l" for n in _numeric(table))
    body = [_latex_row(cell(v) for v in r) for r in table.itertuples(False)]
    lines = [
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        _latex_row(map(str, table.columns)),
        r"\midrule",
        *body,
        r"\bottomrule",
        r"\end{tabular}",
    ]
    return "\n".join(lines) + "\n"


def _latex_row(values: Iterable[str]) -> str:
    """One tabular row, special characters escaped."""
    escape = str.maketrans(LATEX_SPECIAL)
    return " & ".join(v.translate(escape) for v in values) + r" \\"


def write_table(table: pd.DataFrame, out: Path, name: str, runs: str = "") -> list[Path]:
    """<out>/<name>.csv, .md and .tex; the Markdown opens with `runs` (which runs it used) when given.
    Returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.{ext}" for ext in ("csv", "md", "tex")]
    table.to_csv(paths[0], index=False)
    paths[1].write_text(f"{runs}\n\n{markdown(table)}" if runs else markdown(table))
    paths[2].write_text(latex(table))
    return paths
