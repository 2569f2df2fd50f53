"""The screen's reliability, read through the real CSV loader from a study whose rankings along the way
are known: each stage's ranking flips to its final order at a known step, and Stage 2 keeps Stage 1's
order up to Stage 1's last step, then reverses it (the paper's finding, with the steps in between)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cart_sweeps.analysis.load import load_csv
from cart_sweeps.analysis.report import run

STAGE1_SETTLES, STAGE2_SETTLES = 1500, 10000


def _ppl(step: int, r: int, flipped: bool) -> float:
    return 10 + 100_000 / step + (r if flipped else -r)  # above 1, a perplexity's least (the analysis drops less)


@pytest.fixture(scope="module")
def screened(tmp_path_factory):
    rows = []
    for d in (256, 512):
        for r in (2, 4, 6):
            common = {"model": "cart", "variant": "base", "d_model": d, "n_prelude": 6, "n_loops": r}
            for step in range(500, 3001, 500):
                ppl = _ppl(step, r, flipped=step >= STAGE1_SETTLES)
                rows.append({"stage": "1", **common, "seed": 42, "step": step, "ppl_wiki": ppl})
            for seed in (1, 2):
                for step in (1000, 3000, STAGE2_SETTLES, 30500):
                    ppl = _ppl(step, r, flipped=step < STAGE2_SETTLES) + seed / 100
                    rows.append({"stage": "2", **common, "seed": seed, "step": step, "ppl_wiki": ppl})
    tmp = tmp_path_factory.mktemp("screen")
    pd.DataFrame(rows).to_csv(tmp / "steps.csv", index=False)
    report = run(load_csv(tmp / "steps.csv"), tmp / "out", only=["screen"])
    return report, tmp / "out"


def test_each_step_ranking_against_the_final_one(screened):
    _, out = screened
    table = pd.read_csv(out / "screen_agreement.csv", dtype={"stage": str})
    early = table[(table["stage"] == "1") & (table["step"] < STAGE1_SETTLES)]
    late = table[(table["stage"] == "1") & (table["step"] >= STAGE1_SETTLES)]
    assert (early["kendall_tau"] == -1).all() and (early["spearman"] == -1).all() and not early["top1_agrees"].any()
    assert (late["kendall_tau"] == 1).all() and late["top1_agrees"].all()
    assert set(table["n"]) == {3} and set(table["d"]) == {256, 512}


def test_shortest_screen_and_the_stage1_to_stage2_carry_over(screened):
    report, out = screened
    screen = json.loads((out / "findings.json").read_text())["screen"]
    assert screen["shortest"]["1"]["all_widths"] == {"top1_step": STAGE1_SETTLES, "full_order_step": STAGE1_SETTLES}
    assert screen["shortest"]["2"]["256"]["full_order_fraction"] == round(STAGE2_SETTLES / 30500, 4)
    carry = screen["stage1_to_stage2"]["512"]
    assert carry["matching"]["stage2_step"] == 3000 and carry["matching"]["kendall_tau"] == 1
    assert carry["end"]["kendall_tau"] == -1 and carry["end"]["top1_agrees"] is False
    assert screen["limits"] == []
    assert "Stage 1: from step 1500 of 3000 on, every width's ranking matches its final one" in report.summary
    assert {p.name for p in out.glob("screen_vs_step.*")} == {"screen_vs_step.png", "screen_vs_step.pdf"}
