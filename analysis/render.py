"""Write a table as CSV, Markdown and paper-ready LaTeX (own tiny writers: no tabulate or jinja2 needed)."""

from __future__ import annotations

import math
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


CAPTIONS = {  # what each table shows, in a sentence (its metric is named in its headers)
    "stage1_grid": "Stage 1 (screen): the ranking metric at the last step for every width $d$, prelude depth $P$ "
    "and loop count $R$.",
    "stage1_best": "Stage 1: the best $(P, R)$ per width, handed to Stage 2.",
    "stage1_r_benefit": "Stage 1: change of the metric from the smallest to the largest $R$ at the best $P$.",
    "stage1_p_ordering": "Stage 1: whether the ranking of prelude depths $P$ holds at every $R$ and width.",
    "stage1_variance": "Stage 1: share of the variance of the log-metric explained by $P$ and $R$.",
    "stage2_seeds": "Stage 2: mean and standard deviation over seeds of each full-length run.",
    "stage2_best": "Stage 2: the best $R$ per width (mean over seeds).",
    "reversal": "Whether Stage 2 reverses or confirms Stage 1's choice of $R$, tested over Stage 2's seeds.",
    "reversal_cells": "The configurations both stages trained: Stage 1's metric against Stage 2's.",
    "parity": "Dense baselines at parameter parity with CART (stored and effective parameters).",
    "ablations": "Ablations against the base model, with the seed noise of the base.",
    "variable_r": "The metric at inference loop counts $R$ other than the trained one.",
    "rho": "Final gate $\\rho$ against the value weight decay alone predicts.",
    "screen_agreement": "Agreement of each evaluation step's ranking with the final ranking, per stage and width.",
    "screen_transfer": "Stage 1's final ranking against Stage 2's, at the matching step and at the end.",
}
_EXACT = {
    "d": "$d$",
    "P": "$P$",
    "R": "$R$",
    "L": "$L$",
    "n": "$n$",
    "t": "$t$",
    "p_value": "$p$",
    "R_min": "$R_{\\min}$",
    "R_max": "$R_{\\max}$",
    "at_R_min": "at $R_{\\min}$",
    "at_R_max": "at $R_{\\max}$",
    "rho": "$\\rho$",
    "rho_wd_only": "$\\rho$, weight decay only",
    "kendall_tau": "Kendall $\\tau$",
    "spearman": "Spearman $r_s$",
    "top1_agrees": "Same top-1",
    "trained_R": "Trained $R$",
    "stage1_R": "Stage-1 $R$",
    "stage2_R": "Stage-2 $R$",
    "base_seed_std": "Seed s.d.\\ of base",
    "trained_n_loops": "Trained $R$",
    "eval_n_loops": "Inference $R$",
}
_WORDS = {"ppl": "PPL", "bpb": "BPB", "ce": "CE", "cart": "CART", "delta": "$\\Delta$"}
_STATS = {"mean": "mean", "std": "s.d."}
_DECIMALS = {"ppl": 2, "bpb": 3, "ce": 3, "pct": 1, "t": 2, "kendall_tau": 3, "spearman": 3, "rho": 3}


def header(column: str) -> str:
    """A column name as a human header in LaTeX: ppl_wiki_mean -> 'PPL wiki (mean)', R=4 -> '$R=4$'."""
    if column in _EXACT:
        return _EXACT[column]
    if column.startswith("R="):
        return f"${column}$"
    words, stat = column.split("_"), ""
    if words[-1] in _STATS and len(words) > 1:
        stat = f" ({_STATS[words.pop()]})"
    percent = words[-1] == "pct"
    if percent:
        words.pop()
    if words[0] in ("stage1", "stage2"):
        words[0] = f"Stage {words[0][-1]}"
    escape = str.maketrans(LATEX_SPECIAL)
    text = " ".join(_WORDS.get(w, w.translate(escape)) for w in words) + (r" (\%)" if percent else "")
    return text[:1].upper() + text[1:] + stat


def _decimals(column: str, values: pd.Series) -> int:
    """Decimals for every number of a column: by what it measures, else four significant digits of its largest."""
    for key, decimals in _DECIMALS.items():
        if column == key or column.startswith(f"{key}_") or column.endswith(f"_{key}") or f"_{key}_" in column:
            return decimals
    finite = values[np.isfinite(values)]
    if finite.empty or (finite == finite.round()).all():
        return 0
    return max(0, 3 - math.floor(math.log10(max(finite.abs().max(), 1e-12))))


def p_value(p: float) -> str:
    """A p-value in math notation: $p<10^{-3}$ style below 0.001 (as $<10^{-k}$ in a $p$ column)."""
    if p < 1e-3:
        return f"$<10^{{{math.floor(math.log10(max(p, 1e-300))) + 1}}}$"
    return f"${p:.3f}$"


def _latex_cells(table: pd.DataFrame) -> list[list[str]]:
    """Every cell as LaTeX: numbers at their column's fixed precision, p-values in math notation."""
    columns = []
    for name, numeric in zip(table.columns, _numeric(table), strict=True):
        values = table[name]
        if name == "p_value":
            columns.append([p_value(float(v)) if pd.notna(v) else "" for v in values])
        elif numeric:
            floats = pd.to_numeric(values, errors="coerce").astype(float)
            decimals = _decimals(str(name), floats)
            columns.append(["" if np.isnan(v) else f"${v:.{decimals}f}$" for v in floats])
        else:
            escape = str.maketrans(LATEX_SPECIAL)
            columns.append([cell(v).translate(escape) for v in values])
    return [list(row) for row in zip(*columns, strict=True)] if columns else []


def latex(table: pd.DataFrame, name: str) -> str:
    """A booktabs table float with caption and label (needs booktabs and graphicx). A table wider than the
    text is scaled down to \\linewidth, never up: \\resizebox with \\width inside its own width argument."""
    spec = "".join("r" if n else "l" for n in _numeric(table))
    caption = CAPTIONS.get(name, name.replace("_", " ").capitalize() + ".")
    lines = [
        r"\begin{table}[tbp]",
        r"\centering",
        rf"\caption{{{caption}}}",
        rf"\label{{tab:{name}}}",
        r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(header(str(c)) for c in table.columns) + r" \\",
        r"\midrule",
        *(" & ".join(row) + r" \\" for row in _latex_cells(table)),
        r"\bottomrule",
        r"\end{tabular}}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, out: Path, name: str, runs: str = "") -> list[Path]:
    """<out>/<name>.csv, .md and .tex; the Markdown opens with `runs` (which runs it used) when given.
    Returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.{ext}" for ext in ("csv", "md", "tex")]
    table.to_csv(paths[0], index=False)
    paths[1].write_text(f"{runs}\n\n{markdown(table)}" if runs else markdown(table))
    paths[2].write_text(latex(table, name))
    return paths
