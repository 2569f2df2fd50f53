"""What a new user reads from the analysis of stages of their own (the real commands, tiny):

- the closing paragraph names each stage's ranking metric where stages rank by different ones (one by its own
  `sweep.metric: tokens_per_s`), not only the analysis's (before: "Ranking metric: ppl_austen" for both);
- an undecided sentence words each gap in its metric's direction, in % of the pick's value: the worse option of a
  throughput is lower, of a perplexity higher (before: "R=2 is not told from R=4 (31.23% worse ...)" read as if
  the pick were the worse one, and for a maximized metric the % was of the worse option's value).

Checked against gaps computed here by hand from the run folders' summary.json (geometric means over the seeds).
The two stages train the same six runs (stage plain finds them done by stage fast and reads them), ranked two ways.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from stages import sweep, user_stage
from test_axes import TINY, analysis

GRID = """\
name: {name}
grid:
  model.n_loops: [2, 4]
  seed: [1, 2, 3]
recipe:
  model.d_model: 32
  model.n_prelude: 1
  trainer.steps: 3000
"""


def gaps_by_hand(stage: Path, metric: str, higher_is_better: bool) -> dict[int, float]:
    """Per R other than the best, how far its geometric mean over seeds lies from the best's, in % of the best's."""
    values: dict[int, list[float]] = {}
    for path in stage.glob("*/summary.json"):
        s = json.loads(path.read_text())
        values.setdefault(s["model"]["n_loops"], []).append(s[metric])
    means = {r: math.exp(np.mean(np.log(v))) for r, v in values.items()}
    best = (max if higher_is_better else min)(means, key=means.get)
    return {r: 100 * abs(m / means[best] - 1) for r, m in means.items() if r != best}


@pytest.mark.slow
def test_each_stage_names_its_ranking_metric_and_its_gaps_read_in_its_direction(tmp_path, data_cache, capsys):
    runs = tmp_path / "runs"
    for name, metric in (("fast", ["sweep.metric=tokens_per_s"]), ("plain", [])):
        cfg = user_stage(tmp_path / name, GRID.format(name=name))
        done = sweep(runs, "--config-dir", str(cfg), f"stage={name}", *TINY, *metric)
        assert done.returncode == 0, done.stderr[-3000:]

    found = analysis(runs, tmp_path / "out")
    printed = capsys.readouterr().out
    assert (
        "Ranking metric: tokens_per_s for stage fast; ppl_austen for stage plain (a stage's own table: its "
        "sweep.metric); ppl_austen for every other table, since ppl_wiki is absent (the first ppl_* column in sorted "
        "order)."
    ) in printed
    for stage, metric, higher, word in (
        ("fast", "tokens_per_s", True, "lower"),
        ("plain", "ppl_austen", False, "higher"),
    ):
        [record] = found["stage_decisions"][stage]
        hand = gaps_by_hand(runs / "fast", metric, higher)  # the runs both stages read
        assert {c["over"]: c["pct"] for c in record["comparisons"]} == pytest.approx(hand, abs=1e-4)
        said = record["said"]
        if not record["decided"]:  # the parenthesis after the other option says which way it lies from the pick
            [(other, pct)] = re.findall(rf"is not told from R=(\d) \(([\d.]+)% {word}, adjusted p=", said)
            assert float(pct) == pytest.approx(hand[int(other)], abs=0.006), said
        assert "% worse," not in said and said in printed
