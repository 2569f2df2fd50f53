"""Write a table as CSV, Markdown and paper-ready LaTeX (own tiny writers: no tabulate or jinja2 needed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from cart_sweeps.metric import metric

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


SIGNIFICANT = 4  # digits of a column's largest value; the column's other values get the same decimals
SPREAD_SIGNIFICANT = 2  # a standard deviation is worth its first two digits
STAGE_PREFIXES = ("stage1_", "stage2_")  # reversal_cells: a stage's value of a metric


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


def direction(column: str, ranking: str | None = None) -> int:
    """-1 where lower is better, +1 where higher is, 0 for columns that get no best marked: a metric's column
    (ppl_wiki, ppl_wiki_mean, stage1_ppl_wiki, or `R=k`: a grid of the ranking metric) has its metric's."""
    if column.endswith(("_std", "_pct", "_rank")) or column.startswith(("p_", "t_")):
        return 0
    name = ranking if column.startswith("R=") and ranking else column.removesuffix("_mean")
    for prefix in STAGE_PREFIXES:
        name = name.removeprefix(prefix)
    found = metric(name)
    return 0 if found is None else -found.sign


def _is_metric(column: str) -> bool:
    """A score or its spread (ppl_wiki_mean, ppl_wiki_std, bench_piqa_acc, stage1_ppl_wiki)."""
    return direction(column.removesuffix("_std")) != 0


def ranked_first(table: pd.DataFrame, metric: str | None) -> pd.DataFrame:
    """The metric columns in their places, the ranking metric's own (its mean and s.d., its stage columns)
    first among them; every other column stays where it is."""
    if metric is None:
        return table
    columns = list(table.columns)
    slots = [i for i, c in enumerate(columns) if _is_metric(str(c))]
    ours = [columns[i] for i in slots if _mentions(str(columns[i]), metric)]
    rest = [columns[i] for i in slots if columns[i] not in ours]
    for slot, column in zip(slots, ours + rest, strict=True):
        columns[slot] = column
    return table[columns]


def _mentions(column: str, metric: str) -> bool:
    """Whether `column` is `metric` or built from it (ppl_wiki_mean, stage2_ppl_wiki; not ppl_wiki2)."""
    return f"_{column}_".find(f"_{metric}_") >= 0


def _decimals(values: pd.Series, digits: int) -> int:
    """Decimals that give a column's largest value `digits` significant digits (none for whole numbers)."""
    finite = values[np.isfinite(values)]
    top = float(finite.abs().max()) if not finite.empty else 0.0
    if top == 0 or (finite == finite.round()).all():
        return 0
    return max(0, digits - 1 - math.floor(math.log10(top)))


def p_value(p: float) -> str:
    """Every p-value in one notation: three decimals, `<0.001` below that."""
    return "<0.001" if p < 1e-3 else f"{p:.3f}"


def _best(table: pd.DataFrame, column: str, ranking: str | None) -> pd.Series:
    """Where a metric column holds its best value: per width where the table has several rows of a width
    (the R or P to pick there), else over the whole column."""
    sign = direction(column, ranking)
    values = pd.to_numeric(table[column], errors="coerce").astype(float) * sign  # the best is the largest
    if not sign or values.isna().all():
        return pd.Series(False, index=table.index)
    if "d" in table and table["d"].duplicated().any():
        return values == values.groupby(table["d"]).transform("max")
    return values == values.max()


def formatted(table: pd.DataFrame, ranking: str | None = None) -> list[tuple[list[str], list[bool], bool]]:
    """Each column as text (decimals per column, set by its largest value), where its best values are, and whether
    it holds numbers (math in LaTeX)."""
    columns = []
    for name, numeric in zip(table.columns, _numeric(table), strict=True):
        values, best = table[name], _best(table, str(name), ranking).tolist()
        if name == "p_value":
            columns.append(([p_value(float(v)) if pd.notna(v) else "" for v in values], best, True))
        elif numeric:
            floats = pd.to_numeric(values, errors="coerce").astype(float)
            decimals = _decimals(floats, SPREAD_SIGNIFICANT if str(name).endswith("_std") else SIGNIFICANT)
            columns.append((["" if np.isnan(v) else f"{v:.{decimals}f}" for v in floats], best, True))
        else:
            columns.append(([cell(v) for v in values], best, False))
    return columns


def _rows(columns: list[list[str]]) -> list[list[str]]:
    return [list(row) for row in zip(*columns, strict=True)] if columns else []


def markdown(table: pd.DataFrame, metric: str | None = None) -> str:
    """A GitHub-flavoured Markdown table, the ranking metric's columns first, each column's best in bold."""
    table = ranked_first(table, metric)
    rule = ["---:" if n else "---" for n in _numeric(table)]
    cells = [
        [f"**{t}**" if b and t else t.replace("|", r"\|") for t, b in zip(text, best, strict=True)]
        for text, best, _ in formatted(table, metric)
    ]
    lines = [list(map(str, table.columns)), rule, *_rows(cells)]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


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


def _latex_cells(table: pd.DataFrame, ranking: str | None) -> list[list[str]]:
    """Every cell as LaTeX: numbers (p-values too) in math, each column's best in bold."""
    escape = str.maketrans(LATEX_SPECIAL)
    cells = []
    for text, best, numeric in formatted(table, ranking):
        if numeric:
            cells.append(
                [(f"$\\mathbf{{{t}}}$" if b else f"${t}$") if t else "" for t, b in zip(text, best, strict=True)]
            )
        else:
            cells.append([t.translate(escape) for t in text])
    return _rows(cells)


def latex(table: pd.DataFrame, name: str, metric: str | None = None, caption: str | None = None) -> str:
    """A booktabs table float (needs booktabs and graphicx), each column's best in bold; one wider than the text
    is scaled down to \\linewidth, never up."""
    table = ranked_first(table, metric)
    spec = "".join("r" if n else "l" for n in _numeric(table))
    caption = caption or name.replace("_", " ").capitalize() + "."
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
        *(" & ".join(row) + r" \\" for row in _latex_cells(table, metric)),
        r"\bottomrule",
        r"\end{tabular}}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def framed(table: pd.DataFrame, metric: str | None, runs: str = "", under: str | None = None) -> str:
    """The table in Markdown under the line saying which runs it used and over the line said under it (each where
    given), as its .md file and report.md show it."""
    return (f"{runs}\n\n" if runs else "") + markdown(table, metric) + (f"\n{under}.\n" if under else "")


def write_table(
    table: pd.DataFrame, out: Path, name: str, text: str, metric: str | None, caption: str | None
) -> list[Path]:
    """<out>/<name>.csv (every digit), .md (`text`: `framed`) and .tex (its `caption`, else its name), the ranking
    metric's columns first. Returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.{ext}" for ext in ("csv", "md", "tex")]
    ranked_first(table, metric).to_csv(paths[0], index=False)
    paths[1].write_text(text)
    paths[2].write_text(latex(table, name, metric, caption))
    return paths
