"""The README's own-study walk, done as a newcomer does it: its stage file saved in an empty folder, its three
commands run there as written, and what it says it prints checked against what they print."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cart_sweeps.config import REPO_ROOT

README = REPO_ROOT / "README.md"
pytestmark = pytest.mark.slow  # six tiny runs and an analysis: ~40 s on 2 cores


def walk() -> tuple[str, list[str]]:
    """The walk's stage file and its commands, from the README's section."""
    section = README.read_text().partition("## Your own study, step by step")[2].partition("\n## ")[0]
    stage = re.search(r"```yaml\n(.*?)```", section, flags=re.S)
    commands = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert stage and commands, "the README's walk has a stage file and a block of commands"
    lines = [line.split("  #")[0].strip() for line in commands.group(1).splitlines()]
    return stage.group(1), [line for line in lines if line]


def test_the_readmes_walk_runs_as_written_and_decides(tmp_path: Path) -> None:
    stage, commands = walk()
    assert "Save it as `mine/stage/lr_walk.yaml`" in README.read_text()
    (tmp_path / "mine" / "stage").mkdir(parents=True)
    (tmp_path / "mine" / "stage" / "lr_walk.yaml").write_text(stage)
    env = {k: v for k, v in os.environ.items() if k != "CART_SWEEPS_RUNS"}  # runs/ in the folder, as a user's
    printed = []
    for command in commands:
        args = shlex.split(command)
        assert args[:2] == ["python", "-m"], command
        done = subprocess.run(
            [sys.executable, *args[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        printed.append(done.stdout + done.stderr)
    plan, stage_run, analysis = printed
    assert "stage lr_walk at scale=tiny: 6 runs" in plan and "d32-P2-R2-lr1e-3-s42" in plan
    assert "6 completed" in stage_run and (tmp_path / "runs" / "lr_walk" / "ledger.db").is_file()
    out = tmp_path / "analysis" / "out" / "runs"
    decision = json.loads((out / "findings.json").read_text())["stage_decisions"]["lr_walk"]
    assert [(d["axis"], d["choice"], d["decided"]) for d in decision] == [("trainer.lr", 0.01, True)]
    assert decision[0]["edge"] == "lr=0.01 is the grid's largest value"
    assert "Stage lr_walk: lr=0.01 is the best lr" in analysis
    table = (out / "runs_lr_walk.md").read_text()
    assert "| lr | ppl_austen | ppl_austen_std | seeds | ppl_bible | ppl_shakespeare | lr_best |" in table
    rows = [line for line in table.splitlines() if line.startswith("| 0.0")]
    assert [(r.split("|")[1].strip(), r.split("|")[4].strip(), r.split("|")[-2].strip()) for r in rows] == [
        ("0.01000", "3", "best"),
        ("0.00100", "3", ""),
    ]
