"""A results CSV, checked as run folders are (docs/results.md): what cannot be read as the study's numbers is
one line naming the line, the column and the value; a value that measures nothing is blanked and listed, so no
table or claim reads it while its row still says that the run exists; an exact copy of a row is left out, listed.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from cart_sweeps.metric import metric
from cart_sweeps.naming import STAGE_NAME
from cart_sweeps.stagerecord.runset import LeftOut
from cart_sweeps.status import RunStatus

from .errors import AnalysisError
from .select import unmeasured

DUPLICATE = "duplicate"
INT64_END = 2.0**63  # a whole column's values are 64-bit integers (pandas' Int64): below this in size
ROW = "csv_row"  # a column naming each row's place in the file ("results.csv line 5"), for what lists the row


def read(
    path: Path, run_key: Sequence[str], whole: Collection[str], numbers: Collection[str]
) -> tuple[pd.DataFrame, list[LeftOut], dict[str, int]]:
    """The completed rows, typed; the rows left out (listed); the rows not completed, counted by status or reason.
    A run is its `run` column, else its `run_key` values; `numbers` and every metric hold numbers, `whole` whole."""
    text = _fields(path)
    if "stage" not in text:
        raise AnalysisError(f"{path}: needs a 'stage' column (values 1, 2, parity, ablations, variable_r)")
    if (blank := text["stage"].isna()).any():
        raise AnalysisError(f"{path} line {blank.idxmax()}: no stage")
    if (unsafe := ~text["stage"].str.fullmatch(STAGE_NAME.pattern) | text["stage"].isin([".", ".."])).any():
        line = unsafe.idxmax()
        raise AnalysisError(
            f"{path} line {line}: stage {text.at[line, 'stage']!r} cannot name its output files (runs_<stage>.csv); "
            "use at most 128 letters, digits, '-', '_' and '.' (not '.' or '..' alone)"
        )
    names = {*run_key, "run"} - set(numbers)
    frame = pd.DataFrame(
        {c: text[c] if c in names else _numbers(path, text[c], c in whole, c in numbers) for c in text}
    )
    counts: Counter[str] = Counter()
    if "status" in text:
        status = text["status"].fillna(RunStatus.COMPLETED)
        counts.update(status[status != RunStatus.COMPLETED])
        frame = frame[status == RunStatus.COMPLETED]
    key = ["run"] if "run" in frame else [c for c in run_key if c in frame]
    frame, copies = _without_copies(path, frame, text, [*key, *(["step"] if "step" in frame else [])])
    void = _unmeasured(path, frame, text, whole)
    counts.update(o.kind for o, _ in void.values())
    for line, (_, columns) in void.items():
        frame.loc[line, columns] = np.nan
    frame[ROW] = [f"{path.name} line {line}" for line in frame.index]
    left_out = [o for _, o in sorted({**copies, **{line: o for line, (o, _) in void.items()}}.items())]
    return frame, left_out, dict(counts)


def _fields(path: Path) -> pd.DataFrame:
    """The CSV's fields as text, indexed by each row's line in the file (blank lines skipped, blank fields NaN)."""
    rows: dict[int, list[str]] = {}
    try:
        with path.open(newline="", encoding="utf-8-sig") as file:
            reader = csv.reader(file)
            header = next(reader, [])
            for fields in filter(None, reader):
                if len(fields) != len(header):
                    raise AnalysisError(
                        f"{path} line {reader.line_num}: {len(fields)} fields, where the header has {len(header)}"
                    )
                rows[reader.line_num] = [f.strip() for f in fields]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise AnalysisError(f"{path}: not a readable CSV ({err})") from err
    if not header:
        raise AnalysisError(f"{path}: empty (a results CSV starts with a header line: stage,d_model,...)")
    if repeated := [c for c, n in Counter(header).items() if n > 1]:
        raise AnalysisError(f"{path}: column {repeated[0]!r} appears twice in the header")
    table = pd.DataFrame(list(rows.values()), index=list(rows), columns=[c.strip() for c in header], dtype=str)
    return table.replace("", np.nan)


def _numbers(path: Path, texts: pd.Series, whole: bool, required: bool) -> pd.Series:
    """A column as numbers: where `required` (or `whole`, or a metric's column) every value must be one; any other
    column is read as numbers where all its values are, else kept as text (as pandas reads a CSV)."""
    values = pd.to_numeric(texts, errors="coerce")
    nan = texts.str.lower() == "nan"
    wrong = texts.notna() & values.isna() & ~nan
    if whole:  # 2.5, inf, nan, and what no 64-bit integer holds
        wrong |= nan | (values.notna() & ((values % 1 != 0) | (values.abs().astype(float) >= INT64_END)))
    if not wrong.any():
        return values
    if not (required or whole or metric(str(texts.name))):
        return texts
    line = wrong.idxmax()
    size = " of at most 18 digits" if whole and pd.notna(values[line]) and values[line] % 1 == 0 else ""
    raise AnalysisError(f"{path} line {line}: {texts.name} {texts[line]!r} is not a {'whole ' * whole}number{size}")


def _without_copies(
    path: Path, frame: pd.DataFrame, text: pd.DataFrame, key: list[str]
) -> tuple[pd.DataFrame, dict[int, LeftOut]]:
    """The rows less exact copies of earlier ones (listed: the same observation twice); one run in two rows that
    differ is an error, since either may be the one to table."""
    values = frame.astype(object).where(frame.notna(), None)  # None == None, where NaN != NaN
    first: dict[tuple[object, ...], int] = {}  # a row's values -> its line
    runs: dict[tuple[object, ...], tuple[int, tuple[object, ...]]] = {}  # a run's key -> its line and values
    copies = {}
    at = [frame.columns.get_loc(c) for c in key]
    for line, row in zip(frame.index, values.itertuples(index=False, name=None), strict=True):
        if row in first:
            where = f"{path.name} line {line}"
            copies[line] = LeftOut(where, where, DUPLICATE, f"a duplicate of line {first[row]}")
            continue
        first[row] = line
        run = tuple(row[i] for i in at)
        if run in runs:
            earlier, other = runs[run]
            named = ", ".join(f"{c} {text.at[line, c]}" for c in key if pd.notna(text.at[line, c]))
            if "run" not in key and ("seed" not in key or pd.isna(text.at[line, "seed"])):
                raise AnalysisError(
                    f"{path} lines {earlier} and {line}: one configuration at one step ({named}) twice, and no seed "
                    "to tell the rows apart: add a seed column"
                )
            column = next(c for c, a, b in zip(frame.columns, other, row, strict=True) if a != b)
            raise AnalysisError(
                f"{path} lines {earlier} and {line}: one run ({named}) twice, with different {column} "
                f"({_shown(text.at[earlier, column])} and {_shown(text.at[line, column])}); two runs need a column "
                "that tells them apart"
            )
        runs[run] = (line, row)
    return frame.drop(index=list(copies)), copies


def _shown(value: object) -> str:
    return "blank" if pd.isna(value) else repr(value)


def _unmeasured(
    path: Path, frame: pd.DataFrame, text: pd.DataFrame, whole: Collection[str]
) -> dict[int, tuple[LeftOut, list[str]]]:
    """The rows holding a number that measures nothing, by line: what lists each (every such value of its row),
    and the columns holding them."""
    faults: dict[int, list[tuple[str, str, str]]] = {}
    for column in frame.columns:
        if column in whole or not pd.api.types.is_float_dtype(frame[column]):
            continue
        given = frame.loc[text.loc[frame.index, column].notna(), column]  # "nan" counts, a blank does not
        for line, value in given.items():
            if (fault := unmeasured(column, value))[1]:
                faults.setdefault(line, []).append((*fault, column))
    out = {}
    for line, found in faults.items():
        where, reasons = f"{path.name} line {line}", "; ".join(reason for _, reason, _ in found)
        out[line] = (LeftOut(where, where, found[0][0], reasons), [column for _, _, column in found])
    return out
