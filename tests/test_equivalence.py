"""Decisions a researcher can stop on (issue 46): the floor any alpha-correct procedure spends (rules/bound.py,
checked against Garivier & Kaufmann's closed form by hand), "equivalent within E" (two one-sided tests, Holm over
the pairs) through the analysis's `--from-csv --equivalence` on simulated studies with a known truth (false
equivalence at most alpha where the gap is exactly E, power on a true tie), a margin a stage cannot take refused
in one line, the ladder's rung stopping a width on equivalence only where the allowance leaves room, and the
alpha spending over sequential looks."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from stages import sweep

from cart_sweeps.analysis.__main__ import main
from cart_sweeps.config import ConfigError
from cart_sweeps.metric import require
from cart_sweeps.rules.bound import floor, floor_line
from cart_sweeps.rules.decide import ALPHA, holm, look_level, options, pool
from cart_sweeps.rules.ladder_walk import judge
from cart_sweeps.rules.simulation import simulate
from cart_sweeps.sweep.expand import Stage
from cart_sweeps.text import duration

PPL = require("ppl_wiki")
STUDIES = 300  # widths per truth
SEEDS = 6
E = 0.02  # the margin: 2% on the log scale
BOUND = ALPHA + 2.5 * math.sqrt(ALPHA * (1 - ALPHA) / STUDIES)


def test_the_floor_is_garivier_and_kaufmanns_closed_form():
    """Equal gaps D behind the best of k options at noise s: T* = 2 s^2 / D^2 (1 + sqrt(k - 1))^2 runs times
    kl(alpha, 1 - alpha) = (1 - 2 alpha) ln((1 - alpha) / alpha); the issue's figures: 7.7, 17.6, 7.7."""
    kl = (1 - 2 * ALPHA) * math.log((1 - ALPHA) / ALPHA)
    by_hand = 2 * 0.005**2 / 0.01**2 * (1 + math.sqrt(2)) ** 2 * kl
    assert floor([0, 0.01, 0.01], 0.005, ALPHA) == pytest.approx(by_hand, rel=1e-6)
    assert round(by_hand, 1) == 7.7
    assert floor([0, 0.01], 0.005, ALPHA) == pytest.approx(8 * 0.25 * kl, rel=1e-6)  # two options: N = 4 s^2 kl / D^2
    assert round(floor([0, 0.006, 0.008], 0.005, ALPHA), 1) == 17.6  # the paper's gaps
    assert floor([0, 0.0, 0.0], 0.005, ALPHA, margin=0.01) == pytest.approx(by_hand, rel=1e-6)  # a tie at 1%
    assert floor([0, 0.0, 0.02], 0.005, ALPHA) == math.inf  # a tie without a margin: no finite floor


def test_alpha_is_spent_obrien_fleming_like_over_the_looks():
    """The levels sum to alpha, grow look by look, and one look is alpha itself."""
    levels = [look_level(ALPHA, i, 6) for i in range(1, 7)]
    assert sum(levels) == pytest.approx(ALPHA) and levels == sorted(levels) and look_level(ALPHA, 1, 1) == ALPHA
    assert levels[-1] > ALPHA / 6  # the last look tests at more than alpha / looks


def studies(means: tuple[float, ...], path: Path, seed: int) -> Path:
    """A results CSV: Stage 2, per width (a study) four R with SEEDS seeds, log-normal noise of 1%."""
    rng = np.random.default_rng(seed)
    rows = [
        {"stage": "2", "model": "cart", "d_model": d, "n_prelude": 6, "n_loops": r, "seed": s, "step": 100}
        | {"ppl_wiki": m * math.exp(0.01 * rng.normal())}
        for d in range(1, STUDIES + 1)
        for r, m in zip((2, 4, 6, 8), means, strict=True)
        for s in range(SEEDS)
    ]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def claims(tmp_path_factory) -> dict[str, list[dict]]:
    """Per truth, the best-R claims of `python -m cart_sweeps.analysis --from-csv FILE --equivalence 0.02`."""
    tmp = tmp_path_factory.mktemp("eq")
    truths = {"tie": (100.0, 100.0, 110.0, 110.0), "at_margin": (100.0, 100 * math.exp(E), 110.0, 110.0)}
    out = {}
    for seed, (name, means) in enumerate(truths.items()):
        csv = studies(means, tmp / f"{name}.csv", seed)
        assert (
            main(["--from-csv", str(csv), "--out", str(tmp / name), "--only", "stage2_best", "--equivalence", str(E)])
            == 0
        )
        found = json.loads((tmp / name / "findings.json").read_text())["decisions"]
        out[name] = [c for c in found if c["claim"] == "best_R"]
        out[f"{name}_csv"] = [pd.read_csv(csv)]  # type: ignore[list-item]
        out[f"{name}_report"] = [(tmp / name / "report.md").read_text()]  # type: ignore[list-item]
    return out


@pytest.mark.slow  # two analyses of 300 widths: over 3 s
def test_equivalence_past_the_margin_is_decided_at_most_at_alpha(claims):
    """R=4 exactly E behind R=2: "equivalent" is false every time it is said."""
    wrong = [c for c in claims["at_margin"] if set(c["equivalent"]) & {2, 4}]
    assert len(claims["at_margin"]) == STUDIES and len(wrong) / STUDIES <= BOUND


@pytest.mark.slow
def test_a_true_tie_is_decided_equivalent_and_said_so(claims):
    """R=2 and R=4 tied, R=6 and 8 10% behind: decided, the two equivalent, the others beaten, in the record and
    the report's words; the first width's adjusted p by hand (pooled t on log values, TOST and Holm)."""
    tie = claims["tie"]
    equivalent = [c for c in tie if c["decided"] and c["equivalent"] and set([c["choice"], *c["equivalent"]]) == {2, 4}]
    assert len(equivalent) / STUDIES >= 0.7
    named = [c for c in tie if c["decided"] and not c["equivalent"]]  # a best named over a tie: false
    assert len(named) / STUDIES <= BOUND
    assert "are equivalent within 2%" in claims["tie_report"][0]  # type: ignore[operator]
    rows = claims["tie_csv"][0]  # type: ignore[index]
    one = rows[rows["d_model"] == 1]
    logs = {r: np.log(g["ppl_wiki"].to_numpy()) for r, g in one.groupby("n_loops")}
    df = sum(len(v) - 1 for v in logs.values())
    sd = math.sqrt(sum((len(v) - 1) * v.var(ddof=1) for v in logs.values()) / df)
    order = sorted(logs, key=lambda r: logs[r].mean())
    best, se = logs[order[0]].mean(), sd * math.sqrt(2 / SEEDS)
    worse, within = [], []
    for r in order[1:]:
        diff = logs[r].mean() - best
        worse.append(min(1.0, 2 * stats.t.sf(diff / se, df)))
        within.append(max(stats.t.sf((diff + E) / se, df), stats.t.cdf((diff - E) / se, df)))
    adjusted = holm(np.array(worse + within))  # one family: both hypotheses of every pair
    record = next(c for c in tie if c["d"] == 1)
    assert record["p_value"] == pytest.approx(float(np.minimum(adjusted[:3], adjusted[3:]).max()), rel=1e-9)


@pytest.mark.parametrize("value", ["0", "1.5", "nan"])
def test_a_margin_a_stage_cannot_take_is_one_line_before_anything_launches(value):
    with pytest.raises(ConfigError, match=rf"stage.equivalence={value} must be a relative margin between 0 and 1"):
        Stage(["stage=1", "scale=tiny", f"stage.equivalence={value}"])


def test_a_rung_decides_equivalence_only_where_the_allowance_leaves_room():
    """Two configurations 0.1% apart with a tiny seed spread: equivalent within 1% at the last rung (allowance 0)
    and at an earlier rung whose allowance is 0.5%; open where the allowance (1.2%) exceeds the margin."""
    values = {"a": [100.0, 100.02, 99.98], "b": [100.1, 100.12, 100.08]}
    for allowance, ended in ((0.0, True), (0.005, True), (0.012, False)):
        j = judge(values, PPL, allowance, ALPHA, 1, equivalence=0.01)
        assert (not j.open) == ended and (j.equivalent == ["b"]) == ended, allowance
    assert judge(values, PPL, 0.0, ALPHA, 1).dropped == ["b"]  # no margin: a gap beyond the noise, worse


@pytest.mark.slow
def test_a_real_ladder_stops_a_width_on_equivalence_and_its_tables_say_so(tmp_path, data_cache):
    """The real command at the tiny scale (d_model 32, rungs of 5 and 10 steps, two R, two seeds): its two R
    differ by well under the margin, so the first rung decides them equivalent and nothing runs at the second.
    E = 10% is large because two seeds per cell give 2 df, whose t quantile at alpha/looks is 4.3: a paper-scale
    ladder with more seeds states 1%. The analysis's rungs table and sentence say it, from the same runs."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    args = ["stage=ladder", "scale=tiny", "model.d_model=256", "model.n_loops=1,2", "model.n_prelude=1"]
    done = sweep(runs, *args, "stage.rungs=[500,1000]", "stage.max_seeds=2", "stage.equivalence=0.1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stage ladder: equivalent: at 500 steps" in done.stdout + done.stderr
    steps = {json.loads((f / "summary.json").read_text())["trainer"]["steps"] for f in (runs / "ladder").iterdir()
             if (f / "summary.json").is_file()}  # fmt: skip
    assert steps == {5}  # the second rung never ran
    record = json.loads((runs / "ladder" / "ladder.json").read_text())
    assert record["design"]["equivalence"] == 0.1 and {r["action"] for r in record["records"]} == {"equivalent"}
    assert main(["--runs", str(runs), "--out", str(out)]) == 0
    table = pd.read_csv(out / "ladder_ladder_rungs.csv")
    assert set(table["action"]) == {"equivalent"} and set(table["steps"]) == {5}
    assert re.search(r"R=[12] and R=[12] are equivalent within 10%", (out / "report.md").read_text())


@pytest.mark.slow  # about 60 s on 2 cores
def test_every_simulated_design_is_false_at_most_at_alpha_with_a_margin_and_seeds_name_a_clear_winner():
    """`python -m cart_sweeps.simulate --equivalence 0.01`'s designs on known truths (10 studies of 4 widths):
    false decisions (a wrong best, "equivalent" past the margin) within 2.5 binomial s.d. of alpha everywhere;
    sequential seeds name the clear winner; the floor's row is the floor (compute/bound 1)."""
    rows = simulate(reps=10, truths=("ties", "flat_r", "clear"), equivalence=0.01)
    widths = 40
    for r in rows:
        if r.design != "bound":
            assert r.false <= ALPHA + 2.5 * math.sqrt(ALPHA * (1 - ALPHA) / widths), (r.truth, r.design)
    found = {(r.truth, r.design): r for r in rows}
    assert found[("clear", "seeds")].right >= 0.8 and found[("clear", "bound")].over_bound == 1.0
    assert found[("ties", "seeds")].equivalent > found[("ties", "fixed (zoom)")].equivalent


def test_the_analysis_refuses_a_margin_it_cannot_take_in_one_line(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--from-csv", "results.csv", "--equivalence", "2"])
    assert ended.value.code == 2
    assert "'2': use a relative margin between 0 and 1, e.g. 0.01 for 1%" in capsys.readouterr().err


def test_plan_states_the_floor_at_the_observed_gaps_and_noise():
    """`plan`'s floor line (a ladder's, a max_seeds stage's) is rules/bound.floor on the options' gaps and pooled
    s.d., as run time in the hours plan passes (this machine's or GPU-hours); an observed tie without a margin has
    none."""
    values = {6: [100.0, 100.5, 99.5], 8: [101.0, 101.5, 100.5], 10: [103.0, 103.5, 102.5]}
    opts = options(values, PPL)
    noise = pool(opts, "test")
    assert noise is not None
    by_hand = floor([o.score_mean - opts[0].score_mean for o in opts], noise.sd, ALPHA, None, [2.0, 2.0, 2.0])
    assert floor_line(opts, noise.sd, ALPHA, None, [2.0] * 3).startswith(f"floor {duration(by_hand)} of run time")
    tie = options({6: [100.0, 100.5], 8: [100.0, 100.5]}, PPL)
    assert "none finite" in floor_line(tie, 0.005, ALPHA, None, [1.0, 1.0])
