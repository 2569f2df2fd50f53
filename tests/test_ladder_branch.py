"""A WSD branch ladder through the real command: rungs of 1,000, 3,000 and 30,500 paper steps (10, 20 and 30 steps
at scale=tiny), two R with two seeds, trainer.schedule: wsd in the stage file and stage.branch=true. Its driver
killed with SIGKILL mid-stage and relaunched, it finishes; every promoted run names the previous rung's run of
its configuration and seed as its parent, at that run's decay start; a further relaunch trains nothing; and a
last-rung branch (a branch of a branch) ends on the numbers of a fresh WSD run of its length."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from stages import completed, env
from test_ladder_stage import killed_and_relaunched

STAGE = """\
name: wsdladder
rungs: [1000, 3000, 30500]
branch: true
max_seeds: 2
drift: 0.5        # a wide allowance at the first rung: both R reach the last one
grid:
  model.n_loops: [2, 4]
  seed: [42, 137]
recipe:
  model.d_model: 256
  model.n_prelude: 6
  trainer.schedule: wsd
  trainer.deterministic: true
"""
FINAL = ("ppl_austen", "ppl_bible", "ppl_shakespeare", "ce_austen", "bpb_austen", "rho")
FRESH = """\
import sys
from pathlib import Path
from omegaconf import OmegaConf
from cart_sweeps.run import execute
cfg = OmegaConf.load(sys.argv[1])
cfg.trainer.branch_from, cfg.trainer.branch_step, cfg.trainer.keep_checkpoints_at = None, None, []
execute(cfg, Path(sys.argv[2]))
"""


def summaries(runs: Path) -> dict[tuple[int, int, int], dict]:
    """(steps, R, seed) -> the run folder's summary, with its folder."""
    out = {}
    for summary in (runs / "wsdladder").glob("*/summary.json"):
        s = json.loads(summary.read_text())
        out[(s["trainer"]["steps"], s["model"]["n_loops"], s["seed"])] = s | {"folder": summary.parent}
    return out


@pytest.mark.slow
def test_a_wsd_branch_ladder_relaunched_branches_each_rung_and_equals_fresh_runs(tmp_path, data_cache):
    (tmp_path / "cfg" / "stage").mkdir(parents=True)
    (tmp_path / "cfg" / "stage" / "wsdladder.yaml").write_text(STAGE)
    runs = tmp_path / "runs"
    args = ["--config-dir", str(tmp_path / "cfg"), "stage=wsdladder", "scale=tiny"]
    killed_and_relaunched(runs, "wsdladder", args, 3000)

    found = summaries(runs)
    assert {h for h, _, _ in found} == {10, 20, 30}  # both R reached the last rung (the wide allowance)
    for (steps, r, seed), s in found.items():
        if steps == 10:
            assert "parent_run_id" not in s
            continue
        parent = found[(steps - 10, r, seed)]  # the previous rung's run of this configuration and seed
        decay_start = (steps - 10) - round(0.2 * (steps - 10))  # 8 of 10, 16 of 20
        assert (s["parent_run_id"], s["branch_step"]) == (parent["run_id"], decay_start)
    assert (
        len({t.user_attrs["run_id"] for t in completed(runs, "wsdladder")}) == len(found) == 12
    )  # each run trained once

    branch = found[(30, 2, 42)]  # rung 3, branched from rung 2's branch at its decay start (16)
    fresh = tmp_path / "fresh"
    made = subprocess.run(
        [sys.executable, "-c", FRESH, str(branch["folder"] / "config.yaml"), str(fresh)],
        env=env(runs),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    alone = json.loads((fresh / "summary.json").read_text())
    assert "parent_run_id" not in alone and alone["run_id"] == branch["run_id"]
    assert {k: alone[k] for k in FINAL} == pytest.approx({k: branch[k] for k in FINAL}, rel=1e-6)
