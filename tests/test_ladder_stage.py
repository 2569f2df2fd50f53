"""A real ladder at the tiny scale through the real command: rungs of 500, 1,000 and 2,000 paper steps (5, 10 and
20 steps at scale=tiny), one width and two R with two seeds; its driver killed with SIGKILL mid-stage and
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
from stages import completed, env, leftovers, sweep, sweep_cmd, wait_for

from cart_sweeps.analysis.__main__ import main as analysis

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
