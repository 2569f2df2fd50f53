"""What a new user reads in `python -m cart_sweeps.plan`:

- a ladder's rung lines give the steps its runs train here beside the paper's (before: "rung 1 (1000 steps)" at
  scale=tiny, where they train 10), and their second figure says what it assumes ("if nothing is dropped", "as
  measured so far"), so "expected" is one thing, the simulated compute (before: "expected 4 runs, 4 min" beside
  "expected compute ... 0.42x the fixed design", two expectations that disagreed);
- a searched or gridded float is written as the run's label writes it (before: 0.0007106591851092234).
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import pytest
from stages import env, sweep

from cart_sweeps import plan

LADDER = ["stage=ladder", "scale=tiny", "model.d_model=256", "model.n_loops=2,8", "model.n_prelude=6"]


def tiny_steps(paper: int) -> int:
    """scale=tiny's steps for `paper` steps, by docs/scale.md's rule: its table (1,000, 3,000, 30,500 -> 10, 20,
    30), between two lengths the power law through both."""
    table = [(1000, 10), (3000, 20), (30500, 30)]
    (a, x), (b, y) = next((lo, hi) for lo, hi in itertools.pairwise(table) if paper <= hi[0])
    return round(x * (paper / a) ** (math.log(y / x) / math.log(b / a)))


def test_a_ladders_rungs_say_their_trained_steps_and_expected_is_the_simulations_word(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    plan.main([*LADDER, "stage.rungs=[1000,4000,9000]"])
    lines = capsys.readouterr().out.splitlines()
    rungs = [line for line in lines if line.startswith("  rung ")]
    for k, paper in enumerate((1000, 4000, 9000), 1):
        here = tiny_steps(paper)  # 10, 21, 24
        assert rungs[k - 1].startswith(f"  rung {k} ({paper:,} paper steps: {here} here): at most 6 runs, ")
        assert rungs[k - 1].endswith("if nothing is dropped") and "expected" not in rungs[k - 1]
    [total] = [line for line in lines if line.startswith("  total: ")]
    assert "if nothing more is dropped" in total and total.endswith("the expected compute, with drops: simulated below")
    assert [line for line in lines if "expected" in line and line is not total] == [
        next(line for line in lines if line.startswith("  expected compute (simulated, "))
    ]


def test_a_gridded_float_is_written_as_the_label_writes_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    plan.main(["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2", "model.n_prelude=2",
               "trainer.lr=0.0031622776601683794,0.01"])  # fmt: skip
    out = capsys.readouterr().out
    assert "0.0031622776601683794" not in out
    assert " d32-P2-R2-lr3.16e-3-s42 " in out and " 3.16e-3 " in out and " 0.01 " in out


@pytest.mark.slow  # a real search of two tiny trials, then plan
def test_a_sampled_lr_is_written_as_the_label_writes_it(tmp_path, data_cache):
    runs = tmp_path / "runs"
    search = ["stage=lr", "scale=tiny", "sweep.sampler=random", "sweep.n_trials=2", "trainer.steps=4"]
    done = sweep(runs, *search, "model.d_model=32")
    assert done.returncode == 0, done.stderr[-3000:]
    command = [sys.executable, "-m", "cart_sweeps.plan", *search, "model.d_model=32"]
    out = subprocess.run(command, env=env(runs), capture_output=True, text=True, timeout=120).stdout
    for path in (runs / "lr").glob("*/summary.json"):
        lr = json.loads(path.read_text())["trainer"]["lr"]
        mantissa, exponent = f"{lr:.2e}".split("e")  # the label's: three significant digits, lr7.11e-4
        said = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        assert f"-lr{said}-s42 " in out and f" {said} " in out and repr(lr) not in out, out
