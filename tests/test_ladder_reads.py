"""What a new user reads of a ladder with `stage.equivalence=0.05` and `launcher.slots=2` (one real tiny ladder):

- the driver's undecided line says which claim its p is for (before: "1.49% worse ..., not beyond the allowance
  (p=0.0492)", the p of the equivalence claim beside the words of the drop claim);
- the analysis claims equivalence only at a rung where the ladder promoted nothing (here its last; before:
  "at steps=10: R=2 and R=8 are equivalent within 5%" where the ladder, with its drift allowance, promoted both),
  and an undecided sentence states its alpha as the rest of the text prints alphas (0.00833, not 0.00833333);
- plan's ladder lines name their unit: run time summed over runs, not wall time on the slots (before: "about 1 min
  for 12 runs on 2 slots" beside "2 min if nothing more is dropped", and "floor 0.21 GPU-hours" from this
  machine's time beside "0.0 GPU-hours");
- with --metric every table ranks by it, the stage's own too, and the closing line says so (before: "Ranking
  metric: ppl_austen for stage ladder (its sweep.metric)" beside tables of bpb_austen);
- a stage table's metric column is the geometric mean over the seeds, the mean its sentences' % compare (before:
  the arithmetic mean beside a % of geometric means).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from stages import sweep

from cart_sweeps import plan
from cart_sweeps.analysis.__main__ import main as analysis_main

LADDER = ["stage=ladder", "scale=tiny", "model.d_model=256", "model.n_loops=2,8", "model.n_prelude=6",
          "stage.rungs=[1000,4000,9000]", "stage.equivalence=0.05"]  # fmt: skip


@pytest.fixture(scope="module")
def ladder(tmp_path_factory, data_cache) -> tuple[Path, str]:
    runs = tmp_path_factory.mktemp("ladder") / "runs"
    done = sweep(runs, *LADDER, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return runs, done.stdout + done.stderr


def summaries(runs: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (runs / "ladder").glob("*/summary.json")]


def geometric(values: list[float]) -> float:
    return math.exp(np.mean(np.log(values)))


@pytest.mark.slow
def test_the_drivers_undecided_line_says_which_claim_its_p_is_for(ladder):
    _, printed = ladder
    [line] = [s for s in printed.splitlines() if "undecided: at 9000 steps" in s and "worse than" in s]
    assert re.search(r"not beyond the allowance \(p=", line) is None, line
    assert re.search(r"not beyond the allowance \((drop|equivalence) claim's p=[\d.e-]+\)", line), line


@pytest.mark.slow
def test_the_analysis_claims_no_equivalence_where_the_ladder_promoted_and_states_its_alpha(ladder, tmp_path):
    runs, _ = ladder
    assert analysis_main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    found = json.loads((tmp_path / "out" / "findings.json").read_text())
    said = {r["cell"]["trainer.steps"]: r["said"] for r in found["stage_decisions"]["ladder"]}
    last = max(said)
    for steps, sentence in said.items():
        if steps != last:
            assert "equivalent" not in sentence, sentence
    for sentence in said.values():
        assert "0.00833333" not in sentence
        if "not told from" in sentence:
            assert "at alpha=0.00833" in sentence, sentence


@pytest.mark.slow
def test_a_stage_tables_mean_is_named_beside_the_geometric_means_its_sentences_compare(ladder, tmp_path, capsys):
    runs, _ = ladder
    assert analysis_main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    assert (  # without --metric: one reason per table, not two for one
        "Ranking metric: ppl_austen for every table: stage ladder by its sweep.metric, the others since ppl_wiki is "
        "absent (the first ppl_* column in sorted order)."
    ) in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "out" / "runs_ladder.csv")
    by_hand: dict[tuple[int, int], list[float]] = {}
    for s in summaries(runs):
        by_hand.setdefault((s["trainer"]["steps"], s["model"]["n_loops"]), []).append(s["ppl_austen"])
    for row in table.itertuples():
        assert row.ppl_austen == pytest.approx(np.mean(by_hand[(row.steps, row.R)]), rel=1e-9)
    found = json.loads((tmp_path / "out" / "findings.json").read_text())
    [last] = [r for r in found["stage_decisions"]["ladder"] if r["cell"]["trainer.steps"] == 24]
    gap = 100 * abs(geometric(by_hand[(24, 8)]) / geometric(by_hand[(24, 2)]) - 1)
    assert [c["pct"] for c in last["comparisons"]] == [pytest.approx(gap, abs=1e-4)]
    assert (
        "ppl_austen: the seeds' arithmetic mean; the decisions' % compare geometric means, on the log scale they "
        "test (docs/statistics.md)"
    ) in (tmp_path / "out" / "runs_ladder.md").read_text()


@pytest.mark.slow
def test_metric_ranks_every_table_and_the_closing_line_says_so(ladder, tmp_path, capsys):
    runs, _ = ladder
    assert analysis_main(["--runs", str(runs), "--out", str(tmp_path / "out"), "--metric", "bpb_austen"]) == 0
    printed = capsys.readouterr().out
    assert "Ranking metric: bpb_austen for every table, as --metric asks (over stage ladder's sweep.metric " in printed
    assert "ppl_austen for stage ladder (its sweep.metric)" not in printed
    table = pd.read_csv(tmp_path / "out" / "runs_ladder.csv")
    assert "bpb_austen" in table and "ppl_austen" not in table.columns[:4]


@pytest.mark.slow
def test_plans_ladder_lines_name_their_unit(ladder, capsys, monkeypatch):
    runs, _ = ladder
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(runs))
    plan.main([*LADDER, "launcher.slots=2"])
    lines = capsys.readouterr().out.splitlines()
    [total] = [line for line in lines if line.startswith("  total: ")]
    assert "of run time" in total and "not wall time" in total
    assert all("of run time" in line for line in lines if line.startswith("  rung "))
    [floor] = [line for line in lines if ": floor " in line]
    assert "GPU-hours" not in floor and "of run time at the observed gaps" in floor
    assert "the rule's times: run time summed over its runs, on this machine, at its pace above" in lines
