"""A user's own stage gets a decision: the best level of each axis, the others and the variant held fixed.

Real commands at tiny scale: `python -m cart_sweeps` on a stage file of one's own (trainer.lr x seed, CART and a
dense variant), then `python -m analysis`; its findings.json and runs_<stage> table are checked against a
decision computed here by hand from the run folders' summaries (log-perplexity means, the pooled seed s.d., two-
sided t-tests, Holm's step-down). The decision core itself is tested by simulation in tests/test_decisions.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from stages import sweep
from test_axes import TINY, analysis, command

STAGE = """\
name: mine
grid:
  trainer.lr: [1.0e-3, 1.0e-2]
  seed: [1, 2]
variants:
  cart: {}
  dense: {model: dense, model.n_layers: 2}
recipe:
  model.d_model: 256
  model.n_prelude: 2
  model.n_loops: 2
  trainer.steps: 3000
"""
METRIC = "ppl_austen"


@pytest.fixture(scope="module")
def mine(tmp_path_factory, data_cache) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("decide")
    (base / "cfg" / "stage").mkdir(parents=True)
    (base / "cfg" / "stage" / "mine.yaml").write_text(STAGE)
    runs = base / "runs"
    done = sweep(runs, "--config-dir", str(base / "cfg"), "stage=mine", *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    return base, runs


def by_hand(runs: Path) -> pd.DataFrame:
    """One row per run folder: its variant, lr and metric, read from summary.json."""
    rows = []
    for summary in (runs / "mine").glob("*/summary.json"):
        s = json.loads(summary.read_text())
        rows.append(
            {"variant": s["stage_variant"], "lr": s["trainer"]["lr"], "model": s["model"]["name"], "v": s[METRIC]}
        )
    return pd.DataFrame(rows)


def hand_decision(values: dict[float, list[float]], alpha: float = 0.05) -> tuple[float, bool, float]:
    """(best level, decided, largest Holm-adjusted p) of a best-of-k over log-perplexity seeds."""
    logs = {k: np.log(v) for k, v in values.items()}
    order = sorted(logs, key=lambda k: logs[k].mean())
    df = sum(len(v) - 1 for v in logs.values())
    sd = math.sqrt(sum((len(v) - 1) * v.var(ddof=1) for v in logs.values()) / df)
    best = logs[order[0]]
    p = []
    for other in order[1:]:
        o = logs[other]
        t = (o.mean() - best.mean()) / (sd * math.sqrt(1 / len(best) + 1 / len(o)))
        p.append(min(1.0, 2 * stats.t.sf(t, df)))
    m = len(p)
    adjusted = np.maximum.accumulate([(m - i) * q for i, q in enumerate(sorted(p))]).clip(max=1)
    return order[0], bool(adjusted.max() <= alpha), float(adjusted.max())


@pytest.mark.slow
def test_a_user_stage_s_decision_is_in_findings_and_its_table_as_computed_by_hand(mine):
    base, runs = mine
    hand = by_hand(runs)
    assert set(zip(hand["variant"], hand["model"], strict=True)) == {("cart", "cart"), ("dense", "dense")}
    found = analysis(runs, base / "out")
    decisions = found["stage_decisions"]["mine"]
    lr = {d["cell"]["stage.variant"]: d for d in decisions if d["axis"] == "trainer.lr"}
    assert set(lr) == {"cart", "dense"}  # the variant held fixed, never pooled as seeds
    for variant, record in lr.items():
        rows = hand[hand["variant"] == variant]
        choice, decided, p = hand_decision({k: list(g["v"]) for k, g in rows.groupby("lr")})
        assert record["choice"] == pytest.approx(choice) and record["decided"] == decided
        assert record["p_value"] == pytest.approx(p, rel=1e-6)
        assert record["seeds"] == {"0.001": 2, "0.01": 2}
        end = "largest" if choice == 0.01 else "smallest"
        assert record["edge"] == f"lr={record['choice']} is the grid's {end} value"
    variant = {d["cell"]["trainer.lr"]: d for d in decisions if d["axis"] == "stage.variant"}
    for level, record in variant.items():
        rows = hand[hand["lr"] == level]
        choice, decided, _ = hand_decision({k: list(g["v"]) for k, g in rows.groupby("variant")})
        assert (record["choice"], record["decided"], record["edge"]) == (choice, decided, None)
    table = pd.read_csv(base / "out" / "runs_mine.csv")
    for variant, record in lr.items():
        marks = table[table["variant"] == variant].set_index("lr")["lr_best"].fillna("")
        expected = "best" if record["decided"] else "tied"
        assert marks[record["choice"]] == expected
    summary = (base / "out" / "report.md").read_text()
    assert summary.startswith("# Stage mine: regenerated tables\n")  # one's own stage, not "the CART study"
    assert all(d["said"] in summary for d in decisions)


@pytest.mark.slow
def test_decide_names_one_axis_and_an_axis_no_stage_varies_is_one_line(mine):
    base, runs = mine
    done = command(runs, "analysis", "--runs", str(runs), "--out", str(base / "one"), "--decide", "lr")
    assert done.returncode == 0, done.stderr
    decisions = json.loads((base / "one" / "findings.json").read_text())["stage_decisions"]["mine"]
    assert {d["axis"] for d in decisions} == {"trainer.lr"}
    assert "variant_best" not in pd.read_csv(base / "one" / "runs_mine.csv")
    done = command(runs, "analysis", "--runs", str(runs), "--out", str(base / "two"), "--decide", "trainer.wd")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "analysis: --decide trainer.wd: no stage with a seed axis varies it (decidable axes: stage.variant, trainer.lr)"
    ]
