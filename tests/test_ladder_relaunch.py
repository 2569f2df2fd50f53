"""A ladder relaunched with other rungs or another drift starts a new ladder beside the recorded one (said in one
line, the old record kept), trains only what the new ladder wants (no cut-off run of the old one that it does not
want), and its rungs table reads each run's rung and reason by the run's own horizon. Real drivers, killed with
SIGKILL mid-ladder, and the real analysis, tiny scale (1,000 / 2,000 / 2,500 / 4,000 paper steps train 10 / 15 /
18 / 21 steps)."""

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
from stages import completed, leftovers, sweep, sweep_cmd, user_stage, wait_for, with_fault

from cart_sweeps.analysis.__main__ import main as analysis

pytestmark = pytest.mark.slow  # real ladders launched, killed and relaunched (minutes)

LADDER = """\
name: {name}
grid:
  model.d_model: [32]
  {axis}
  seed: [42, 137]
recipe:
  trainer.min_lr: 3.0e-5
"""


def killed_at(runs: Path, cfg: Path, args: list[str], where: str, tmp: Path) -> None:
    """Launch the ladder with its runs whose folder holds `where` held at their first step; kill its driver
    (SIGKILL) once one is, and wait for its runs to end: those runs are left cut off in the ledger."""
    mark, log = tmp / "paused", tmp / "killed.log"
    environ = with_fault(runs, f"step:pause:1:{where}", mark)
    with log.open("w") as out:
        driver = subprocess.Popen(sweep_cmd("--config-dir", str(cfg), *args), env=environ, stdout=out, stderr=out)
    try:
        wait_for(mark.exists, 900, f"a run of {where}", log)
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    wait_for(lambda: not leftovers(runs), 120, "the killed driver's runs to end")


def summaries(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/summary.json"))]


def test_a_ladder_relaunched_with_other_rungs_starts_a_new_one_and_tables_each_run_by_its_horizon(tmp_path):
    """[1000, 2000, 4000] killed in its third rung, relaunched as [1000, 2500, 4000]: the new ladder runs its
    rung 2 before any rung-3 run (the old one's cut-off rung-3 runs waited), and its table gives each run the rung
    and reason of its own horizon: 18-step rows at 2500, 21-step rows at 4000 (not pending), 15-step rows
    (the old ladder's rung 2) in no rung of this ladder."""
    cfg = user_stage(tmp_path, LADDER.format(name="mine", axis="model.n_loops: [1, 2]"))
    runs, out = tmp_path / "runs", tmp_path / "out"
    old = ["stage=mine", "scale=tiny", "stage.rungs=[1000,2000,4000]"]
    killed_at(runs, cfg, old, "-steps21-", tmp_path)
    new = ["stage=mine", "scale=tiny", "stage.rungs=[1000,2500,4000]"]
    done = sweep(runs, "--config-dir", str(cfg), *new)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "Traceback" not in said
    finished = [s.split(":")[0] for s in said.splitlines() if ": completed" in s and not s.startswith("stage ")]
    rung_2 = [i for i, label in enumerate(finished) if "-steps18-" in label]
    rung_3 = [i for i, label in enumerate(finished) if "-steps21-" in label]
    assert len(rung_2) == 4 and (not rung_3 or max(rung_2) < min(rung_3)), finished  # rung 2 decided first
    (line,) = [s for s in said.splitlines() if "new ladder" in s]
    assert "stage.rungs=[1000, 2500, 4000]" in line and "[1000, 2000, 4000]" in line, line

    record = json.loads((runs / "mine" / "ladder.json").read_text())
    assert record["design"]["rungs"] == [1000, 2500, 4000]
    (aside,) = (runs / "mine").glob("ladder~*.json")  # the old ladder's record, kept beside
    assert json.loads(aside.read_text())["design"]["rungs"] == [1000, 2000, 4000]
    promoted = {r["config"] for r in record["records"] if r["steps"] == 2500 and r["action"] == "promoted"}
    at_4000 = {t.params["model.n_loops"] for t in completed(runs, "mine") if t.params["trainer.steps"] == 4000}
    assert at_4000 == {int(c.split()[0].split("=")[1]) for c in promoted}  # rung 3: what the new rung 2 promoted

    assert analysis(["--runs", str(runs), "--out", str(out), "--only", "ladder"]) == 0
    table = pd.read_csv(out / "ladder_mine_rungs.csv")
    by_hand: dict[tuple[int, int], list[float]] = defaultdict(list)
    for s in summaries(runs / "mine"):
        if s["status"] == "completed":
            by_hand[(s["trainer"]["steps"], s["model"]["n_loops"])].append(s["ppl_austen"])
    horizon = {10: (1, 1000), 18: (2, 2500), 21: (3, 4000)}  # the run's own steps -> this ladder's rung
    assert sorted(set(table["steps"])) == sorted({steps for steps, _ in by_hand})
    for row in table.itertuples():
        r = int(row.config.split()[0].split("=")[1])
        assert row.ppl_austen == pytest.approx(np.mean(by_hand[(row.steps, r)]), rel=1e-9)
        if row.steps in horizon:
            rung, paper = horizon[row.steps]
            assert row.rung == rung and row.reason.startswith(f"at {paper} steps"), row
            assert row.action != "pending", row
        else:  # 15 steps: the old ladder's rung 2
            assert row.steps == 15 and row.action == "not in this ladder" and pd.isna(row.rung), row


def test_a_ladder_relaunched_with_another_drift_starts_a_new_one_and_trains_nothing_it_dropped(tmp_path):
    """A ladder with a wide drift allowance promotes both learning rates; killed in rung 2 as the far worse rate's
    runs start and relaunched with stage.drift=0, the new ladder drops that rate at rung 1 (said in its lines), and
    its cut-off rung-2 runs never train; the old ladder's record is kept beside."""
    cfg = user_stage(tmp_path, LADDER.format(name="rate", axis="trainer.lr: [3.0e-3, 3.0e-5]"))
    runs = tmp_path / "runs"
    base = ["stage=rate", "scale=tiny", "stage.rungs=[1000,2000]"]
    killed_at(runs, cfg, [*base, "stage.drift=5"], "-lr3e-5-steps15-", tmp_path)

    def rates(steps: int) -> set[float]:
        """The learning rates completed at `steps` (paper numbers)."""
        return {t.params["trainer.lr"] for t in completed(runs, "rate") if t.params["trainer.steps"] == steps}

    assert rates(1000) == {3.0e-3, 3.0e-5} and 3.0e-5 not in rates(2000)  # promoted by the wide ladder, cut off
    done = sweep(runs, "--config-dir", str(cfg), *base, "stage.drift=0")
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert 3.0e-5 not in rates(2000), said[-3000:]  # the dropped rate trained no further
    assert "dropped: at 1000 steps" in said and "lr=3e-05" in said, said[-3000:]
    (line,) = [s for s in said.splitlines() if "new ladder" in s]
    assert "stage.drift=0" in line, line
    record = json.loads((runs / "rate" / "ladder.json").read_text())
    assert record["design"]["prior"] == 0
    (aside,) = (runs / "rate").glob("ladder~*.json")
    assert json.loads(aside.read_text())["design"]["prior"] == 5
