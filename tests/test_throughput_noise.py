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
    assert table.rstrip().split("\n\n")[-1].startswith(f"{line}. "), table  # then which mean the table shows
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


SCREEN = [
    "stage=1",
    *TINY,
    "model.d_model=32",
    "model.n_prelude=1",
    "model.n_loops=1,2",
    "seed=1,2",
    "sweep.metrics=[tokens_per_s,ppl_austen]",  # two objectives: a pareto_1 table too
]


def stage_bullets(report: str, stage: str) -> list[str]:
    """The findings report.md lists under `### Stage <stage>`."""
    said = report.split(f"### Stage {stage}\n\n", 1)[1].split("\n\n", 1)[0]
    return [line.removeprefix("- ") for line in said.splitlines()]


@pytest.mark.slow
def test_the_paper_claims_and_the_front_ranked_by_tokens_per_s_say_it_was_measured_beside_other_runs(
    tmp_path, data_cache
):
    runs = tmp_path / "runs"
    done = sweep(runs, *SCREEN)  # launcher.slots=2
    assert done.returncode == 0, done.stderr[-3000:]
    line = (
        f"tokens_per_s measured with 2 runs at once on {os.cpu_count()} CPU cores: the seeds of one configuration "
        f"differ by up to {spread_by_hand(runs / '1'):.0%}"
    )

    def analysed(metric: str) -> Path:
        out = tmp_path / metric
        command = [sys.executable, "-m", "cart_sweeps.analysis", "--runs", str(runs), "--out", str(out)]
        done = subprocess.run([*command, "--metric", metric], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return out

    out = analysed("tokens_per_s")
    for table in ["pareto_1", "stage1_grid", "stage1_r_benefit"]:  # the front; paper tables of tokens/s unnamed
        text = (out / f"{table}.md").read_text()
        assert f"{line}." in text.rstrip().split("\n\n")[-1], text  # the note under the table
    assert "measured with" not in (out / "rho.md").read_text()  # reads no throughput
    report = (out / "report.md").read_text()
    said = stage_bullets(report, "1")  # the paper's best-R claim, its R benefit, the stage's own decision
    assert said[0].startswith("Stage 1, d=32 P=1: ") and said[1].startswith("From the smallest to the largest R")
    assert all(s.endswith(f"; {line}.") for s in said), said
    rho = next(s for s in report.splitlines() if s.startswith("- Final rho spans"))  # reads no throughput
    assert "measured with" not in rho, rho

    said = stage_bullets((analysed("ppl_austen") / "report.md").read_text(), "1")  # the claims read perplexity
    claim = next(s for s in said if s.startswith("Stage 1, d=32 P=1: "))
    assert "measured with" not in claim, claim


def test_the_screens_sentences_of_a_stage_measured_beside_others_say_so_and_the_limits_do_not():
    """The shortest screen and the Stage 1 -> 2 carry-over rank by the metric over steps: with the throughput
    measured beside other runs, each carries its stage's line; what the input cannot show (across stages) does not."""
    from cart_sweeps.analysis.findings import ACROSS, said
    from cart_sweeps.options import StageRole

    line = "tokens_per_s measured with 2 runs at once on 2 CPU cores: the seeds of one configuration differ by up to 9%"
    screen = {
        "shortest": {"1": {"all_widths": {"full_order_step": 10, "top1_step": 5}, "32": {"final_step": 20}}},
        "stage1_to_stage2": {"32": {"end": {"stage2_step": 30, "top1_agrees": True, "kendall_tau": 1.0}}},
        "limits": ["a single seed per cell cannot show its noise."],
    }
    f = {"metric": "tokens_per_s", "measured_with": {"1": line, "2": line}, "screen": screen}
    parts = said(f, {StageRole.screen.value: "1", StageRole.confirm.value: "2"})
    ranked = [s for at, s in parts if at != ACROSS]
    assert [at for at, _ in parts] == ["Stage 1", "Stage 2", ACROSS]
    assert ranked[0].startswith("Stage 1: from step 10 of 20 on") and all(s.endswith(f"; {line}.") for s in ranked)
    assert parts[-1] == (ACROSS, "a single seed per cell cannot show its noise.")
