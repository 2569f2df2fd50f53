"""Each paper table's claims and marks are fields of its one record (analysis/registry.py), and read and add
columns the table has: checked on every table that makes claims, built from run folders and the paper's CSV."""

from __future__ import annotations

import pytest
from test_analysis import PAPER, run_tree  # noqa: F401 (a fixture)

from cart_sweeps.analysis.load import load_csv, load_runs
from cart_sweeps.analysis.registry import TABLES, Table
from cart_sweeps.analysis.tables import stage1_grid


def _claiming() -> list[str]:
    return [name for name, table in TABLES.items() if table.claims is not None]


def test_the_claiming_tables_are_the_ones_the_words_make():
    assert _claiming() == [
        "stage1_best", "stage1_p_ordering", "stage2_best", "reversal", "parity", "ablations", "variable_r",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="give it claims too"):
        Table(reads=("screen",), build=stage1_grid, mark=TABLES["stage1_best"].mark)


def test_every_claim_and_mark_reads_and_adds_columns_of_its_table(run_tree):  # noqa: F811
    studies = [load_runs(run_tree), load_csv(PAPER)]
    checked = set()
    for name in _claiming():
        record = TABLES[name]
        for study in studies:
            final = study.final()
            metric = "ppl_wiki" if "ppl_wiki" in final and final["ppl_wiki"].notna().any() else "ppl_austen"
            final = final[final[metric].notna()]
            try:
                table = record.of(study, final, metric)
            except Exception:  # this input cannot give the table (the other one does)
                continue
            assert set(record.claims.reads) <= set(table.columns), name
            marked, claims = record.decide(table, final, metric, 0.05)
            assert claims, name
            if record.mark:
                assert set(record.mark.reads) <= set(table.columns), name
                assert set(record.mark.adds) <= set(marked.columns), name  # holds: the point ranking, then its verdict
            checked.add(name)
    assert checked == set(_claiming())
