"""A real ladder at the tiny scale through the real command: rungs of 500, 1,000 and 2,000 paper steps (5, 10 and
15 steps at scale=tiny), one width and two R with two seeds; its driver killed with SIGKILL mid-stage and
relaunched, the ladder it finishes is the one its records say, a further relaunch trains nothing and records
the same ladder, and the analysis's tables match the run folders by hand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from stages import completed, env, leftovers, sweep, sweep_cmd, trials, user_stage, wait_for

from cart_sweeps.analysis.__main__ import main as analysis

REPO = Path(__file__).resolve().parents[1]
ARGS = ["stage=ladder", "scale=tiny", "model.d_model=256", "model.n_loops=2,8", "model.n_prelude=6"]
ARGS += ["stage.rungs=[500,1000,2000]", "stage.max_seeds=2"]


def killed_and_relaunched(runs: Path, stage: str, args: list[str], rung_two: int) -> dict:
    """Kill the ladder's driver (SIGKILL) once a run of its second rung (`rung_two` steps) is done, relaunch it to
    its end, then once more: that launch trains nothing and records the same ladder. Returns the record."""
    driver = subprocess.Popen(sweep_cmd(*args), env=env(runs), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(
            lambda: any(t.params["trainer.steps"] == rung_two for t in completed(runs, stage)), 300, "a rung-2 run"
        )
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    wait_for(lambda: not leftovers(runs), 120, "the killed driver's runs to end")
    again = sweep(runs, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    record = json.loads((runs / stage / "ladder.json").read_text())
    once_more = sweep(runs, *args)
    assert once_more.returncode == 0 and "0 completed" in once_more.stderr, once_more.stderr[-2000:]
    assert json.loads((runs / stage / "ladder.json").read_text()) == record  # the same ladder
    return record


@pytest.mark.slow
def test_a_ladder_killed_mid_stage_resumes_to_the_same_ladder_and_its_tables_match_its_runs(tmp_path, data_cache):
    record = killed_and_relaunched(tmp_path, "ladder", ARGS, 1000)

    finished = completed(tmp_path, "ladder")
    runs = {(t.params["trainer.steps"], t.params["model.n_loops"], t.params["seed"]) for t in finished}
    assert len(runs) == len({t.user_attrs["run_id"] for t in finished})  # each run trained once
    promoted = {(r["steps"], r["config"]) for r in record["records"] if r["action"] == "promoted"}
    for steps, nxt in ((500, 1000), (1000, 2000)):
        ran_next = {r for h, r, _ in runs if h == nxt}
        assert ran_next == {int(c.split()[0].split("=")[1]) for h, c in promoted if h == steps}  # n_loops=R ...
    assert {s for _, _, s in runs} == {42, 137}
    assert all("added" in t.user_attrs for t in finished if t.params["trainer.steps"] > 500)

    out = tmp_path / "out"
    assert analysis(["--runs", str(tmp_path), "--out", str(out), "--only", "ladder"]) == 0
    table = pd.read_csv(out / "ladder_ladder_rungs.csv")
    by_hand: dict[tuple[int, int], list[float]] = defaultdict(list)
    for folder in (tmp_path / "ladder").iterdir():
        if (summary := folder / "summary.json").is_file():
            s = json.loads(summary.read_text())
            by_hand[(s["trainer"]["steps"], s["model"]["n_loops"])].append(s["ppl_austen"])
    for row in table.itertuples():
        r = int(row.config.split()[0].split("=")[1])
        assert row.ppl_austen == pytest.approx(np.mean(by_hand[(row.steps, r)]), rel=1e-9)
    assert set(table["action"]) <= {"promoted", "dropped", "decided", "undecided"}
    assert (out / "ladder_ladder_curves.png").is_file() and (out / "ladder_ladder_drift.csv").is_file()
    assert (out / "ladder_ladder_agreement.csv").is_file()


def by_hand(folders: list[Path], metric: str = "ppl_austen") -> dict[tuple[int, int], float]:
    """(steps, n_loops) -> the seed mean of `metric`, read from each run's summary.json."""
    values: dict[tuple[int, int], list[float]] = defaultdict(list)
    for folder in folders:
        if (summary := folder / "summary.json").is_file():
            s = json.loads(summary.read_text())
            values[(s["trainer"]["steps"], s["model"]["n_loops"])].append(s[metric])
    return {key: float(np.mean(v)) for key, v in values.items()}


COPIED = ["scale=tiny", "model.d_model=256", "model.n_loops=2,8", "model.n_prelude=6", "stage.rungs=[500,1000,2000]"]
COPIED += ["stage.max_seeds=3"]


@pytest.mark.slow
def test_a_ladder_copied_into_a_root_holding_its_runs_references_them_and_records_the_seeds_it_adds(tmp_path):
    """The shipped ladder, then the same ladder under another name (a --config-dir copy) into the same runs root:
    the copy's runs are all the shipped ladder's, so it trains none, referencing each; the seed its rule adds
    (stage.max_seeds) is recorded as its own addition (crashed: 271 not in the grid's seed range)."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    shipped = sweep(runs, "stage=ladder", *COPIED, timeout=900)
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    assert 271 in {t.params["seed"] for t in completed(runs, "ladder")}  # the rule added a seed: the copy will too
    text = (REPO / "sweeps" / "ladder.yaml").read_text().replace("name: ladder\n", "")
    cfg = user_stage(tmp_path, f"name: copy\n{text}")
    copy = sweep(runs, "--config-dir", str(cfg), "stage=copy", *COPIED)
    assert copy.returncode == 0, copy.stdout[-2000:] + copy.stderr[-3000:]
    assert "0 completed, 0 failed" in copy.stderr and "Traceback" not in copy.stderr
    theirs, mine = completed(runs, "ladder"), completed(runs, "copy")
    assert sorted(t.user_attrs["run_id"] for t in mine) == sorted(t.user_attrs["run_id"] for t in theirs)
    assert {t.user_attrs["owner"] for t in mine} == {"ladder"}  # referenced, every one
    added = [t for t in mine if t.params["seed"] == 271]
    assert added and all("seed 271 added" in t.user_attrs["added"] for t in added)
    assert not [p for p in (runs / "copy").iterdir() if (p / "summary.json").exists()]  # no run trained twice
    again = sweep(runs, "--config-dir", str(cfg), "stage=copy", *COPIED)
    assert again.returncode == 0 and "0 completed, 0 failed" in again.stderr, again.stderr[-3000:]
    assert len(trials(runs, "copy")) == len(mine)  # the relaunch records nothing new

    assert analysis(["--runs", str(runs), "--out", str(out), "--only", "ladder"]) == 0
    hand = by_hand(list((runs / "ladder").iterdir()))
    for stage in ("ladder", "copy"):
        table = pd.read_csv(out / f"ladder_{stage}_rungs.csv")
        assert len(table) == len(hand)
        for row in table.itertuples():
            assert row.ppl_austen == pytest.approx(hand[(row.steps, int(row.config.split()[0].split("=")[1]))])


LADDERS = {  # where a ladder's width is (the grid, the recipe, nowhere: the model's own) and what it varies
    "grid": ("grid: {model.d_model: [32], model.n_loops: [1, 2], seed: [42, 137]}", "d_model=256", "n_loops"),
    "recipe": (
        "recipe: {model.d_model: 32, model.n_prelude: 2}\ngrid: {model.n_loops: [1, 2], seed: [42, 137]}",
        "d_model=256",
        "n_loops",
    ),
    "absent": ("grid: {model.n_prelude: [2, 4], seed: [42, 137]}", "the stage", "n_prelude"),
}


@pytest.mark.slow
@pytest.mark.parametrize("where", list(LADDERS))
def test_a_ladder_names_the_width_it_ran_and_its_tables_are_written_wherever_the_width_is(tmp_path, where):
    """A ladder's lines name its width from the grid or the recipe, or say `the stage`, never `None`; the
    analysis writes its tables (crashed: IntCastingNaNError in rungs_table), R and P in the grid, the recipe or
    neither."""
    axes, width, varied = LADDERS[where]
    cfg = user_stage(tmp_path, f"name: mine\nrungs: [500, 1000]\n{axes}\n")
    runs, out = tmp_path / "runs", tmp_path / "out"
    done = sweep(runs, "--config-dir", str(cfg), "stage=mine", "scale=tiny")
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "None" not in said, said[-3000:]
    record = json.loads((runs / "mine" / "ladder.json").read_text())["records"]
    assert record and all(r["reason"].startswith(f"at {r['steps']} steps, {width}: {varied}=") for r in record)
    assert analysis(["--runs", str(runs), "--out", str(out), "--only", "ladder"]) == 0
    table = pd.read_csv(out / "ladder_mine_rungs.csv")
    values: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for folder in (runs / "mine").iterdir():
        if (summary := folder / "summary.json").is_file():
            s = json.loads(summary.read_text())
            values[(s["trainer"]["steps"], s["model"]["d_model"], s["model"][varied])].append(s["ppl_austen"])
    assert len(table) == len(values) and set(table["d"]) == {d for _, d, _ in values}
    for row in table.itertuples():
        mean = np.mean(values[(row.steps, row.d, int(row.config.split("=")[1]))])
        assert row.ppl_austen == pytest.approx(mean, rel=1e-9)


TINY_LADDER = ["stage=ladder", "scale=tiny", "model.d_model=256", "model.n_loops=2,8", "model.n_prelude=6"]
TINY_LADDER += ["stage.rungs=[1000,4000,9000]", "stage.max_seeds=2"]


@pytest.mark.slow
def test_the_ladders_drift_table_measures_per_ln_paper_steps(tmp_path, data_cache):
    """docs/ladder.md's tiny ladder (10, 21 and 24 steps at scale=tiny for 1,000, 4,000 and 9,000 paper steps): the
    analysis's drift rates are gap changes per ln(paper steps), the unit of the driver and the prior it checks (it
    used the trained steps, ln(21/10)), by hand from the run folders and ladder.json."""
    ran = sweep(tmp_path, *TINY_LADDER)
    assert ran.returncode == 0, ran.stderr[-3000:]
    design = json.loads((tmp_path / "ladder" / "ladder.json").read_text())["design"]
    paper = dict(zip(design["steps"]["tiny"], design["rungs"], strict=True))  # trained steps -> paper steps
    logs: dict[tuple[int, int], list[float]] = defaultdict(list)
    for folder in (tmp_path / "ladder").iterdir():
        if (summary := folder / "summary.json").is_file():
            s = json.loads(summary.read_text())
            logs[(paper[s["trainer"]["steps"]], s["model"]["n_loops"])].append(np.log(s["ppl_austen"]))
    mean = {key: float(np.mean(v)) for key, v in logs.items()}
    out = tmp_path / "out"
    assert analysis(["--runs", str(tmp_path), "--out", str(out), "--only", "ladder"]) == 0
    drift = pd.read_csv(out / "ladder_ladder_drift.csv")
    rows = drift[drift["d"] != "all"]
    assert len(rows), "a configuration at two rungs beside its best"
    for row in rows.itertuples():
        r, ref = (int(c.split()[0].split("=")[1]) for c in (row.config, row.against))
        closed = mean[(row._1, r)] - mean[(row._1, ref)] - mean[(row.to, r)] + mean[(row.to, ref)]
        assert row.closed_per_ln_h == pytest.approx(closed / np.log(row.to / row._1), abs=1e-6)
        assert str(row.d) == "32"  # the width its runs trained, as every analysis table names it
