"""The whole tiny study through the real commands (`make demo` shortened)."""

from __future__ import annotations

import json


def test_quick_demo_runs_every_stage_then_the_analysis(quick_demo):
    root, first = quick_demo
    for stage, runs in {"1": 8, "2": 8, "parity": 3, "ablations": 8, "variable_r": 3, "benchmarks": 4}.items():
        assert f"stage {stage}: {runs} completed, 0 failed" in first, stage
        assert (root / "runs" / stage / "ledger.db").exists()
    findings = json.loads((root / "out" / "findings.json").read_text())
    assert set(findings["stage1"]["best_per_width"]) == {"32", "96"}
    assert set(findings["stage2"]["best_R_per_width"]) == {"32", "96"}
    assert "spearman" in findings["reversal"] and findings["parity"]["stored"]["gap_pct"]
    tables = ("stage1_best", "stage2_seeds", "reversal", "parity", "ablations", "variable_r", "rho", "benchmarks")
    for table in (*tables, "variable_r_bench"):
        assert (root / "out" / f"{table}.md").exists(), table
    assert (root / "out" / "stage1_ppl_vs_R.png").stat().st_size > 10_000
    assert "| d | P | R | ppl_austen |" in first  # the demo ends by printing tables
    assert "| bench_cart_lastword_acc |" in first.split("benchmarks.md:")[-1]  # the lm-eval columns among them
