"""Zoom decides only what it ran, and runs every cell its screen cannot rule out (issue 46 item 3): a real tiny
Stage 1, then `stage=2 stage.select=zoom` through the real command, its candidates checked against the screen's
values read by hand from the run folders, the threshold computed by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats
from stages import sweep

SCREEN = ["stage=1", "scale=tiny", "trainer.steps=20", "model.d_model=256", "model.n_loops=1,2,4,8"]
SCREEN += ["model.n_prelude=1,6", "trainer.lr=3e-2", "trainer.min_lr=3e-2"]  # gaps of 0.5% to 35% at 20 steps
CONFIRM = ["stage=2", "scale=tiny", "trainer.steps=4", "stage.select=zoom", "model.d_model=256", "seed=42"]
DRIFT, SD, ALPHA = 0.0073, 0.005, 0.05  # the paper's drift prior (tests/test_ladder.py), the stated seed s.d.


def screen_values(runs: Path) -> dict[tuple[int, int], float]:
    summaries = [json.loads(p.read_text()) for p in (runs / "1").glob("*/summary.json")]
    return {(s["model"]["n_loops"], s["model"]["n_prelude"]): s["ppl_austen"] for s in summaries}


def cross(best: tuple[int, int], grid: dict[tuple[int, int], float]) -> set[tuple[int, int]]:
    """The best and its grid neighbours on each axis (past an edge by the last step; none below R=1, P=0)."""
    out = {best}
    for axis, lowest in ((0, 1), (1, 0)):
        values = sorted({c[axis] for c in grid})
        i = values.index(best[axis])
        below = values[i - 1] if i else best[axis] - (values[1] - values[0])
        above = values[i + 1] if i < len(values) - 1 else best[axis] + (values[-1] - values[-2])
        out |= {tuple(v if k == axis else best[k] for k in (0, 1)) for v in (below, above) if v >= lowest}
    return out


def not_ruled_out(values: dict[tuple[int, int], float]) -> tuple[set[tuple[int, int]], float]:
    """Holm's step-down by hand: the largest log gap first, each beyond the drift allowance from 3,000 to 30,500
    steps plus the two-sided normal critical value of a difference of two one-seed values at the stated s.d."""
    best = min(values, key=values.__getitem__)
    gaps = sorted(((math.log(v / values[best]), c) for c, v in values.items() if c != best), reverse=True)
    allowance = DRIFT * math.log(30500 / 3000)
    for i, (gap, _) in enumerate(gaps):
        level = ALPHA / (len(gaps) - i)
        threshold = allowance + stats.norm.isf(level / 2) * SD * math.sqrt(2)
        if gap <= threshold:
            return {best, *(c for _, c in gaps[i:])}, threshold
    return {best}, allowance + stats.norm.isf(ALPHA / 2) * SD * math.sqrt(2)


@pytest.mark.slow
def test_zoom_runs_every_cell_its_screen_cannot_rule_out_and_no_other(tmp_path, data_cache):
    runs = tmp_path / "runs"
    assert sweep(runs, *SCREEN).returncode == 0
    values = screen_values(runs)
    kept, threshold = not_ruled_out(values)
    neighbours = cross(min(values, key=values.__getitem__), values)
    assert kept - neighbours, "a cell outside the neighbours within the threshold"
    assert set(values) - neighbours - kept, "a cell outside the neighbours beyond it"
    confirm = sweep(runs, *CONFIRM)
    assert confirm.returncode == 0, confirm.stderr
    ran = {(s["model"]["n_loops"], s["model"]["n_prelude"]) for s in map(json.loads, _summaries(runs / "2"))}
    assert ran == kept | neighbours
    said = f"kept {len(kept)} cells the screen could not rule out (gap <= {threshold:.2%}"
    assert said in confirm.stdout
    record = json.loads((runs / "2" / "stage.json").read_text())["promoted"]
    assert [(r["model.d_model"], sorted(map(tuple, r["candidates"]))) for r in record] == [(256, sorted(ran))]
    assert record[0]["threshold"] == pytest.approx(threshold) and said in record[0]["said"]


def _summaries(folder: Path) -> list[str]:
    return [p.read_text() for p in folder.glob("*/summary.json")]
