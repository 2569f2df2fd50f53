"""A table whose rows differ in a recipe key says each row's (a `steps` column), and no row pools two recipes:
a stage relaunched for one cell with another trainer.steps, through the real commands, and a results CSV whose
cell holds a 30-step and a 60-step seed. A table at one recipe keeps its look."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cart_sweeps.analysis.__main__ import main

GRID = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2,6", "trainer.steps=6"]
SLOTS = ["launcher.slots=2", "launcher.poll_s=0.2"]


def _csv(path: Path) -> Path:
    """Stage 1 at 30 steps (d=256, P 2 and 6, R 2 and 4, seed 1), one more seed of P=6 R=4 at 60 steps, and a
    60-step run of P=2 R=2 at d=512 (a cell of its own); Stage 2 at 100 steps (P=6, R 2 and 4, two seeds)."""
    rows = [(1, 256, p, r, 1, 30, 100.0 + 10 * p + r) for p in (2, 6) for r in (2, 4)]
    rows += [(1, 256, 6, 4, 2, 60, 90.0), (1, 512, 2, 2, 1, 60, 80.0)]
    rows += [(2, 256, 6, r, seed, 100, 50.0 + r + seed) for r in (2, 4) for seed in (1, 2)]
    frame = pd.DataFrame(rows, columns=["stage", "d_model", "n_prelude", "n_loops", "seed", "steps", "ppl_wiki"])
    frame.assign(model="cart", variant="base", step=frame["steps"]).to_csv(path, index=False)
    return path


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_csv_cell_of_two_recipes_is_two_rows_each_with_its_steps(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--from-csv", str(_csv(tmp_path / "results.csv")), "--out", str(out)]) == 0
    grid = pd.read_csv(out / "stage1_grid.csv")
    assert list(grid.columns[:3]) == ["steps", "d", "P"] and "seeds R=4" not in grid
    by_hand = [  # (steps, d, P, R=2, R=4): the 30-step seed and the 60-step seed of P=6 R=4 are never averaged
        (30, 256, 2, 122.0, 124.0),
        (30, 256, 6, 162.0, 164.0),
        (60, 256, 6, None, 90.0),
        (60, 512, 2, 80.0, None),
    ]
    got = [tuple(None if pd.isna(v) else v for v in row) for row in grid[["steps", "d", "P", "R=2", "R=4"]].values]
    assert sorted(got, key=str) == sorted(by_hand, key=str)
    best = pd.read_csv(out / "stage1_best.csv")
    assert sorted(zip(best["steps"], best["d"], best["P"], best["R"], strict=True)) == [
        (30, 256, 2, 2),
        (60, 256, 6, 4),
        (60, 512, 2, 2),
    ]
    cells = pd.read_csv(out / "reversal_cells.csv")  # reads stages 1 and 2: whose steps it is, said
    assert sorted(zip(cells["steps (stage 1)"], cells["R"], cells["stage1_ppl_wiki"], strict=True)) == [
        (30, 2, 162.0),
        (30, 4, 164.0),
        (60, 4, 90.0),
    ]
    seeds = pd.read_csv(out / "stage2_seeds.csv")  # Stage 2 is at one recipe: no column added
    assert "steps" not in seeds and not any(c.startswith("steps") for c in seeds.columns)
    assert seeds["ppl_wiki_mean"].tolist() == [53.5, 55.5]
    assert (out / "stage1_grid.md").read_text().startswith("| steps | d | P |")
    printed = capsys.readouterr().out  # said once, and no finding drawn across the recipes
    assert "Runs of different recipes (steps, steps (stage 1)) are tabled apart" in printed
    assert "stage1" not in json.loads((out / "findings.json").read_text())


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_one_recipe_study_gets_no_recipe_column(tmp_path):
    out = tmp_path / "out"
    frame = pd.read_csv(_csv(tmp_path / "all.csv"))
    frame[frame["steps"] != 60].to_csv(tmp_path / "one.csv", index=False)
    assert main(["--from-csv", str(tmp_path / "one.csv"), "--out", str(out)]) == 0
    for name in ("stage1_grid", "stage1_best", "reversal_cells", "stage2_seeds", "runs_1", "runs_2"):
        assert not any(str(c).startswith("steps") for c in pd.read_csv(out / f"{name}.csv").columns), name


def _cart_sweeps(runs: Path, *args: str) -> None:
    env = {**os.environ, "CART_SWEEPS_RUNS": str(runs)}
    done = subprocess.run([sys.executable, "-m", "cart_sweeps", *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow  # three tiny training runs
def test_a_narrowed_relaunch_with_other_steps_gives_its_cell_its_steps(tmp_path, data_cache):
    runs, out = tmp_path / "runs", tmp_path / "out"
    _cart_sweeps(runs, "-m", *GRID, *SLOTS)
    _cart_sweeps(runs, "-m", *GRID[:-2], "model.n_prelude=6", "trainer.steps=12", *SLOTS)
    assert main(["--runs", str(runs), "--out", str(out)]) == 0
    used = json.loads((out / "findings.json").read_text())["selection"]["1"]
    left_out = {e["run"] for e in used["excluded"]}
    by_hand = {}  # P -> the trainer.steps of the run each cell's table row reads (its summary's)
    for path in (runs / "1").glob("*/summary.json"):
        if f"1/{path.parent.name}" not in left_out:
            summary = json.loads(path.read_text())
            by_hand[summary["model"]["n_prelude"]] = summary["trainer"]["steps"]
    assert len(by_hand) == 2 and by_hand[2] != by_hand[6]
    for name in ("stage1_grid", "runs_1"):
        table = pd.read_csv(out / f"{name}.csv")
        assert dict(zip(table["P"], table["steps"], strict=True)) == by_hand, name
