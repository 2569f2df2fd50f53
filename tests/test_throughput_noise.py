"""Issue 49 item 4: tokens/s measured with other runs on the same cores is said to be, with its seeds' spread, under
the table that ranks by it and in its decision; a stage run one at a time says nothing of it. Real stages, tiny."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest
from stages import env, sweep, user_stage
from test_axes import TINY, analysis

FAST = """\
name: fast
grid:
  model.n_loops: [1, 2]
  seed: [1, 2]
recipe:
  model.d_model: 32
  model.n_prelude: 1
  trainer.steps: 3000
"""
RANKED = [*TINY, "sweep.metric=tokens_per_s"]


def spread_by_hand(stage: Path) -> float:
    """(max - min) / median of tokens/s over one configuration's seeds, the largest over the configurations."""
    by_config: dict[str, list[float]] = {}
    for path in stage.glob("*/summary.json"):
        s = json.loads(path.read_text())
        by_config.setdefault(s["config_id"], []).append(s["tokens_per_s"])
    return max((max(v) - min(v)) / median(v) for v in by_config.values())


@pytest.mark.slow
def test_tokens_per_s_measured_two_at_a_time_is_said_with_its_spread(tmp_path, data_cache):
    cfg, runs = user_stage(tmp_path, FAST), tmp_path / "runs"
    done = sweep(runs, "--config-dir", str(cfg), "stage=fast", *RANKED)  # launcher.slots=2
    assert done.returncode == 0, done.stderr[-3000:]
    line = (
        f"tokens_per_s measured with 2 runs at once on {os.cpu_count()} CPU cores: the seeds of one configuration "
        f"differ by up to {spread_by_hand(runs / 'fast'):.0%}"
    )
    found = analysis(runs, tmp_path / "out")
    table = (tmp_path / "out" / "runs_fast.md").read_text()
    assert table.rstrip().endswith(f"{line}."), table
    assert f"{line}." in (tmp_path / "out" / "report.md").read_text()
    for decision in found["stage_decisions"]["fast"]:
        assert decision["said"].endswith(f"; {line}."), decision["said"]

    alone = tmp_path / "alone"  # the same stage one run at a time: nothing to say
    command = [sys.executable, "-m", "cart_sweeps", "-m", "--config-dir", str(cfg), "stage=fast", *RANKED]
    done = subprocess.run([*command, "launcher.slots=1"], env=env(alone), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = analysis(alone, tmp_path / "out1")
    assert "measured with" not in (tmp_path / "out1" / "runs_fast.md").read_text()
    assert not any("measured with" in d["said"] for d in found["stage_decisions"]["fast"])
