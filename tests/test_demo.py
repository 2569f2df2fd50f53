"""The whole tiny study through the real commands (`make demo` shortened)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from stages import run_quick_demo

# The runs each stage trains. Stage 1: the 8 corners, then each width's best again with 2 more seeds
# (stage.replicates=1). Parity's and the ablations' CART base, d96-P6-R6-s42, is Stage 2's run: referenced.
QUICK_RUNS = {"1": 12, "2": 8, "parity": 2, "ablations": 7, "variable_r": 3, "benchmarks": 4}
REFERENCED = {"parity": 1, "ablations": 1}


def test_quick_demo_runs_every_stage_then_the_analysis(quick_demo):
    root, first = quick_demo
    for stage, runs in QUICK_RUNS.items():
        assert f"stage {stage}: {runs} completed, 0 failed" in first, stage
        assert (root / "runs" / stage / "ledger.db").exists()
    for stage, n in REFERENCED.items():
        assert f"stage {stage}: {n} run done in another stage, referenced, not trained again: d96-P6-R6-s42" in first
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


def test_a_second_demo_finds_every_run_done(quick_demo):
    """Every stage keeps a ledger: the same demo again trains nothing and still ends in the tables."""
    root, _ = quick_demo
    second = run_quick_demo(root)
    for stage, trained in QUICK_RUNS.items():
        runs = trained + REFERENCED.get(stage, 0)
        assert f"stage {stage}: {runs} runs; {runs} done, skipped" in second, stage
        assert f"stage {stage}: 0 completed, 0 failed" in second, stage
    assert "| d | P | R | ppl_austen |" in second


def test_the_quick_demos_ablations_count_each_run_once(quick_demo):
    """The ablations table from the real stages, against the run folders read by hand: every switch of
    sweeps/ablations.yaml has its row (single_loop, an override rather than a model switch, too), the base is
    the R=6 base configuration's own value (not mixed with R=1), and the noise counts each distinct run of that
    configuration once (its seed 42 is trained by Stage 2 and read by parity and the ablations)."""
    root, _ = quick_demo
    table = pd.read_csv(root / "out" / "ablations.csv")
    switches = set(yaml.safe_load((Path(__file__).parents[1] / "sweeps" / "ablations.yaml").read_text())["variants"])
    assert set(table["variant"]) == switches - {"base"} and len(switches - {"base"}) == 7
    summaries = [json.loads(p.read_text()) for p in (root / "runs").glob("*/*/summary.json")]
    [base] = {s["run_id"]: s for s in summaries if s["label"] == "d96-P6-R6-s42" and not s.get("eval_n_loops")}.values()
    distinct = {s["run_id"]: s for s in summaries if s.get("config_id") == base["config_id"]}
    seeds = sorted(s["seed"] for s in distinct.values())
    assert seeds == [42, 137]  # Stage 2's quick seeds; parity's and the ablations' seed 42 is the same run
    rows = table[table["metric"] == "ppl_austen"].set_index("variant")
    assert (rows["base"] == base["ppl_austen"]).all() and (rows["base_seeds"] == len(seeds)).all()
    assert rows["base_seed_std"].iloc[0] == pytest.approx(pd.Series([s["ppl_austen"] for s in distinct.values()]).std())
    decisions = json.loads((root / "out" / "findings.json").read_text())["decisions"]
    assert all(c["metric"] for c in decisions)  # each names what it compared, undecidable ones too (a reversal's)
    claims = [c for c in decisions if c["claim"] == "ablation"]
    assert len(claims) == 7 * 3 and {c["noise"]["df"] for c in claims} == {len(seeds) - 1}
