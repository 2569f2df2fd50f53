"""The metric is one record (cart_sweeps/metric.py): its direction, label, range and tested scale, read by
everything that ranks, tests, marks bold or plots. A higher-is-better metric ranks best-first from run folders
and from a CSV; a metric added in a copy of the code is one Kind in one file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cart_sweeps.analysis.__main__ import main
from cart_sweeps.metric import DEFAULT, metric, require

REPO = Path(__file__).resolve().parents[1]
ACC = "bench_cart_lastword_acc"
ACCURACY = {6: 0.30, 8: 0.50, 10: 0.10}  # R=8 best by accuracy (and worst by perplexity)
PERPLEXITY = {6: 100.0, 8: 120.0, 10: 90.0}


def test_the_record_says_direction_range_and_label():
    assert require("ppl_wiki").direction == "minimize" and not require("ppl_wiki").valid(1.0)
    assert require(ACC).direction == "maximize" and require(ACC).valid(0.0) and not require(ACC).valid(1.5)
    assert require("tokens_per_s").higher_is_better and require("bench_hellaswag_acc_norm").kind.name == "acc_norm"
    assert require("ppl_austen").label == "perplexity on austen (lower is better)"
    assert metric("rho") is None and metric("ppl_") is None and DEFAULT == "ppl_wiki"
    with pytest.raises(ValueError, match="rho is not a metric whose direction is known"):
        require("rho")


def rows() -> list[dict]:
    return [
        {"stage": "2", "model": "cart", "d_model": 32, "n_prelude": 6, "n_loops": r, "seed": s, "step": 40}
        | {"ppl_austen": PERPLEXITY[r] * (1 + s / 1000), ACC: ACCURACY[r] + s / 1000}
        for r in ACCURACY
        for s in (1, 2, 3)
    ]


def run_folders(root: Path) -> Path:
    """The same runs as summary.json files (stage 2 folders, no ledger)."""
    for row in rows():
        label = f"d32-P6-R{row['n_loops']}-s{row['seed']}"
        folder = root / "2" / label
        folder.mkdir(parents=True)
        model = {"name": "cart", "d_model": 32, "n_prelude": 6, "n_loops": row["n_loops"], "n_layers": 4}
        summary = {"status": "completed", "stage": "2", "run_id": label, "label": label, "seed": row["seed"]}
        summary |= {"step": 40, "model": model, "ppl_austen": row["ppl_austen"], ACC: row[ACC]}
        (folder / "summary.json").write_text(json.dumps(summary))
    return root


@pytest.mark.parametrize("source", ["csv", "runs"])
def test_a_higher_is_better_metric_ranks_best_first_everywhere(tmp_path, source):
    if source == "csv":
        pd.DataFrame(rows()).to_csv(tmp_path / "results.csv", index=False)
        given = ["--from-csv", str(tmp_path / "results.csv")]
    else:
        given = ["--runs", str(run_folders(tmp_path / "runs"))]
    out = tmp_path / "out"
    assert main([*given, "--out", str(out), "--metric", ACC]) == 0
    best = pd.read_csv(out / "stage2_best.csv")
    assert best["R"].tolist() == [8] and best[f"{ACC}_mean"].tolist() == [pytest.approx(0.502)]
    if source == "csv":  # folders without a ledger name no axes: their stage table is one row
        assert pd.read_csv(out / "runs_2.csv")["R"].tolist() == [8, 6, 10]  # the stage's own table, best first
    [claim] = [c for c in json.loads((out / "findings.json").read_text())["decisions"] if c["claim"] == "best_R"]
    assert claim["choice"] == 8 and claim["decided"] and claim["margin"]["over"] == 6
    assert claim["margin"]["pct"] == pytest.approx((0.502 - 0.302) / 0.502 * 100, rel=1e-3)  # % of the best
    seeds = (out / "stage2_seeds.md").read_text()
    assert "| 32 | 6 | 8 | 3 | **0.5020** |" in seeds  # bold on the highest accuracy, lowest perplexity
    assert "| 32 | 6 | 10 | 3 | 0.1020 | 0.0010 | **90.2** |" in seeds
    assert main([*given, "--out", str(tmp_path / "ppl")]) == 0  # the default metric: perplexity, lowest first
    assert pd.read_csv(tmp_path / "ppl" / "stage2_best.csv")["R"].tolist() == [10]


def test_a_metric_without_a_record_or_without_values_is_one_line(tmp_path, capsys):
    pd.DataFrame(rows()).to_csv(tmp_path / "results.csv", index=False)
    for asked, says in [
        ("rho", "analysis: --metric rho is not a metric whose direction is known"),
        ("ppl_wiki", "analysis: --metric ppl_wiki: no run has it (have: bench_cart_lastword_acc, ppl_austen)"),
    ]:
        assert main(["--from-csv", str(tmp_path / "results.csv"), "--out", str(tmp_path / "o"), "--metric", asked]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(says), err


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_new_metric_is_one_kind_in_one_file(tmp_path):
    """The walk for a metric (docs/extending.md), done in a copy of the code: a higher-is-better per-set kind added to
    cart_sweeps/metric.py's KINDS ranks, tests and marks in its direction; the copy differs in that file alone
    (a run computes its values in train/loop.py's eval_metrics: the walk's second file, not needed to analyse)."""
    copy = tmp_path / "code"
    shutil.copytree(REPO / "src", copy / "src", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "analysis", copy / "analysis", ignore=shutil.ignore_patterns("__pycache__", "out"))
    for configs in ("conf", "sweeps"):
        shutil.copytree(REPO / configs, copy / configs)
    record = copy / "src" / "cart_sweeps" / "metric.py"
    text = record.read_text()
    kind = '    Kind("top1", "top-1 accuracy", "", True, 0.0, 1.0, low_inclusive=True, log_scale=False),\n'
    record.write_text(text.replace("KINDS = (\n", "KINDS = (\n" + kind, 1))
    changed = [
        p.relative_to(copy) for p in copy.rglob("*.py") if (REPO / p.relative_to(copy)).read_bytes() != p.read_bytes()
    ]
    assert changed == [Path("src/cart_sweeps/metric.py")]
    frame = pd.DataFrame(rows()).rename(columns={ACC: "top1_austen"})
    frame.to_csv(tmp_path / "results.csv", index=False)
    env = {**os.environ, "PYTHONPATH": f"{copy / 'src'}{os.pathsep}{copy}"}
    command = [sys.executable, "-m", "cart_sweeps.analysis", "--from-csv", str(tmp_path / "results.csv")]
    command += ["--metric", "top1_austen"]
    done = subprocess.run([*command, "--out", str(tmp_path / "out")], cwd=copy, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert pd.read_csv(tmp_path / "out" / "stage2_best.csv")["R"].tolist() == [8]


def test_a_run_folder_value_outside_its_metrics_range_is_listed_not_tabled(tmp_path, capsys):
    root = run_folders(tmp_path / "runs")
    path = root / "2" / "d32-P6-R8-s1" / "summary.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"ppl_austen": 0.5}))
    assert main(["--runs", str(root), "--out", str(tmp_path / "out")]) == 0
    assert "left out 2/d32-P6-R8-s1: ppl_austen=0.5 is outside the perplexity range (1, inf)" in capsys.readouterr().out
    findings = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert findings["input"]["not_completed"] == {"out of range": 1}
    assert pd.read_csv(tmp_path / "out" / "stage2_seeds.csv").set_index("R").loc[8, "seeds"] == 2
