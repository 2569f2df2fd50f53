"""Zoom decides only what it ran, and runs every cell its screen cannot rule out (issue 46 item 3): a real tiny
Stage 1, then `stage=2 stage.select=zoom` through the real command, its candidates checked against the screen's
values read by hand from the run folders, the threshold computed by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats
from stages import env, sweep

from cart_sweeps.analysis.__main__ import main as analysis
from cart_sweeps.metric import require
from cart_sweeps.rules.zoom import drift_allowance, measured_noise, ordered, screen

SCREEN = ["stage=1", "scale=tiny", "trainer.steps=20", "model.d_model=256", "model.n_loops=1,2,4,8"]
SCREEN += ["model.n_prelude=1,6", "trainer.lr=3e-2", "trainer.min_lr=3e-2"]  # gaps of 0.5% to 35% at 20 steps
CONFIRM = ["stage=2", "scale=tiny", "trainer.steps=4", "stage.select=zoom", "model.d_model=256", "seed=42"]
DRIFT, SD, ALPHA = 0.0073, 0.005, 0.05  # the paper's drift prior (tests/test_ladder.py), the stated seed s.d.
PPL = require("ppl_wiki")


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


def not_ruled_out(values: dict[tuple[int, int], list[float]]) -> tuple[set[tuple[int, int]], float]:
    """Holm's step-down by hand over cells of n seeds each: the largest gap of log means first, each beyond the drift
    allowance from 3,000 to 30,500 steps plus the two-sided critical value of a difference of two n-seed means: a
    t on the pooled s.d. where n > 1, else the normal at the stated s.d."""
    logs = {c: [math.log(x) for x in v] for c, v in values.items()}
    mean = {c: sum(v) / len(v) for c, v in logs.items()}
    n = len(next(iter(values.values())))
    df = len(values) * (n - 1)
    sd = math.sqrt(sum((x - mean[c]) ** 2 for c, v in logs.items() for x in v) / df) if df else SD
    best = min(mean, key=mean.__getitem__)
    gaps = sorted(((mean[c] - mean[best], c) for c in mean if c != best), reverse=True)
    allowance = DRIFT * math.log(30500 / 3000)

    def threshold(level: float) -> float:
        quantile = stats.t.isf(level / 2, df) if df else stats.norm.isf(level / 2)
        return allowance + quantile * sd * math.sqrt(2 / n)

    for i, (gap, _) in enumerate(gaps):
        if gap <= threshold(ALPHA / (len(gaps) - i)):
            return {best, *(c for _, c in gaps[i:])}, threshold(ALPHA / (len(gaps) - i))
    return {best}, threshold(ALPHA)


GRID = [(r, p) for r in (2, 4, 6, 8) for p in (2, 3, 4, 6)]


@pytest.mark.parametrize(
    "values",
    [
        {c: [30 * math.exp(0.004 * i)] for i, c in enumerate(GRID)},  # one seed, 0.4% apart: the prior s.d.
        {c: [30 * math.exp(0.004 * i + 0.006 * s) for s in (-1, 1)] for i, c in enumerate(GRID)},  # two seeds
    ],
)
def test_the_zoom_keeps_the_cross_and_what_its_screen_cannot_rule_out(values):
    found = screen(256, ordered(values, PPL), PPL, drift_allowance(3000, 30500), measured_noise(ordered(values, PPL)))
    kept, threshold = not_ruled_out(values)
    best = min(values, key=lambda c: sum(values[c]))
    assert set(found.unruled) == kept and found.threshold == pytest.approx(threshold)
    assert set(found.cells) == kept | cross(best, dict.fromkeys(GRID, 0.0))
    assert f"kept {len(kept)} cells the screen could not rule out (gap <= {threshold:.2%}" in found.line()


@pytest.mark.slow
def test_zoom_runs_every_cell_its_screen_cannot_rule_out_and_no_other(tmp_path, data_cache):
    runs = tmp_path / "runs"
    assert sweep(runs, *SCREEN).returncode == 0
    values = screen_values(runs)
    kept, threshold = not_ruled_out({c: [v] for c, v in values.items()})
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


NARROW = ["scale=tiny", "model.d_model=32", "model.n_loops=1,2,4", "model.n_prelude=1,2", "trainer.steps=20"]


@pytest.mark.slow
def test_after_a_zoom_stage_2_plan_reads_a_lone_r_and_the_audit_counts_the_stages_own_candidates(tmp_path, data_cache):
    """After a real zoom Stage 2 (three seeds a cell), plan says a group of one R (a P the cross adds past the
    grid's edge) has nothing to compare (it crashed on its missing p), and the analysis's promotion audit counts the
    candidates stage.json records, by the zoom's own rule, not the cross alone (it said 'below_cutoff' of some)."""
    runs, zoom = tmp_path / "runs", ["stage=2", "stage.select=zoom", *NARROW]
    assert sweep(runs, "stage=1", *NARROW).returncode == 0
    confirm = sweep(runs, *zoom)
    assert confirm.returncode == 0, confirm.stderr
    values = screen_values(runs)
    candidates = not_ruled_out({c: [v] for c, v in values.items()})[0] | cross(min(values, key=values.get), values)
    record = json.loads((runs / "2" / "stage.json").read_text())["promoted"]
    assert sorted(map(tuple, record[0]["candidates"])) == sorted(candidates)

    plan = subprocess.run(
        [sys.executable, "-m", "cart_sweeps.plan", *zoom], env=env(runs), capture_output=True, text=True
    )
    assert plan.returncode == 0, plan.stderr
    alone = {p: rs for p in {p for _, p in candidates} if len(rs := [r for r, q in candidates if q == p]) == 1}
    assert alone, "the cross adds a P with one R"
    for p, (r,) in alone.items():
        assert f"d_model=256 n_prelude={p}: 3 seeds per cell, R={r} alone: nothing to compare" in plan.stdout

    out = tmp_path / "out"
    assert analysis(["--runs", str(runs), "--out", str(out), "--only", "screen_promotion"]) == 0
    audit = json.loads((out / "findings.json").read_text())["screen"]["promotion"]["32"]
    assert (audit["promoted"], audit["below_cutoff"], audit["zoomed"]) == (len(candidates), 0, True)


def _summaries(folder: Path) -> list[str]:
    return [p.read_text() for p in folder.glob("*/summary.json")]
