"""One "best per width" for the whole study (cart_sweeps.rules.decide.ranked): the tables' stage2_best, zoom's ranking,
the promotion audit's winner and the run the benchmarks stage evaluates all name the same configuration, by the
best seed mean, with exact ties to the smallest R (then P) and said as ties. Checked against numbers chosen by
hand so that the best single run and the best seed mean disagree."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from cart_sweeps.analysis.load import load_csv
from cart_sweeps.analysis.report import run
from cart_sweeps.config import ConfigError
from cart_sweeps.metric import require
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.rules.decide import best, ranked
from cart_sweeps.rules.zoom import D, P, R, best_single_run, ordered, zoom_candidates
from cart_sweeps.stagerecord.runset import RunSet, StageRun

PPL = require("ppl_wiki")
# Stage 2, P=6, two seeds: (d, R) -> ppl_wiki per seed. At d=32 the best single run (R=2 seed 1: 10.0) is not in
# the best configuration by seed mean (R=4: 11.25 against R=2's 12.0 and R=6's 12.0); at d=48 R=2 and R=4 tie
# exactly (21.0 each) and R=6 is worse.
STAGE2 = {
    (32, 2): [10.0, 14.0],
    (32, 4): [11.0, 11.5],
    (32, 6): [12.0, 12.0],
    (48, 2): [20.0, 22.0],
    (48, 4): [21.5, 20.5],
    (48, 6): [23.0, 23.0],
}
# Stage 1, one seed: the same widths and R, P=6, so the promotion audit has both stages.
STAGE1 = {(32, 2): 13.0, (32, 4): 12.5, (32, 6): 12.9, (48, 2): 22.0, (48, 4): 22.5, (48, 6): 22.9}


def test_the_rule_breaks_exact_ties_to_the_smallest_option_and_says_so():
    assert [r.option for r in ranked({(4, 6): [11.0, 11.5], (2, 6): [10.0, 14.0]}, PPL)] == [(4, 6), (2, 6)]
    tie = best({(4, 6): [21.5, 20.5], (2, 6): [22.0, 20.0], (6, 6): [23.0]}, PPL)
    assert tie is not None and tie.choice == (2, 6) and tie.tied == ((4, 6),)
    full = best({6: [1.0], 2: [1.0], 4: [1.0]}, require("bench_cart_lastword_acc"))
    assert full is not None and full.choice == 2 and full.tied == (4, 6)
    assert best({2: [0.4], 4: [0.5]}, require("bench_cart_lastword_acc")).choice == 4  # higher is better here


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, pd.DataFrame]:
    tmp = tmp_path_factory.mktemp("best")
    rows = [
        {"stage": "2", "model": "cart", "variant": "base", "d_model": d, "n_prelude": 6, "n_loops": r, "seed": s,
         "ppl_wiki": v}
        for (d, r), values in STAGE2.items() for s, v in enumerate(values, start=1)
    ] + [
        {"stage": "1", "model": "cart", "variant": "base", "d_model": d, "n_prelude": 6, "n_loops": r, "seed": 1,
         "ppl_wiki": v}
        for (d, r), v in STAGE1.items()
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp / "results.csv", index=False)
    run(load_csv(tmp / "results.csv"), tmp / "out", only=["stage2_best", "screen_promotion"])
    return {name: pd.read_csv(tmp / "out" / f"{name}.csv") for name in ("stage2_best", "screen_promotion")}


def _stage2_runs(lr: Callable[[int, int], float] = lambda d, r: 3e-3) -> RunSet:
    """Stage 2's runs as the benchmarks stage reads them (cart_sweeps.stagerecord.runset), from the same numbers;
    `lr(d, R)`: each cell's recorded trainer.lr."""
    out = RunSet("2", "by hand")
    for (d, r), values in STAGE2.items():
        for seed, value in enumerate(values, start=1):
            label = f"d{d}-P6-R{r}-s{seed}"
            params = {D: d, R: r, P: 6, "seed": seed}
            record = {
                "status": "completed",
                "run_id": label,
                "label": label,
                "ppl_wiki": value,
                "trainer": {"lr": lr(d, r)},
            }
            summary = RunSummary.from_dict(record)
            cell = tuple(sorted((k, v) for k, v in params.items() if k != "seed"))
            out.used.append(
                StageRun(label, label, Path(label), params, {}, cell, label, 0, (), 0, "completed", summary)
            )
    return out


def test_tables_zoom_promotion_and_benchmarks_name_one_best(tables):
    best2 = tables["stage2_best"].set_index("d")
    assert best2["R"].to_dict() == {32: 4, 48: 2}  # by seed mean; at 48 the tie goes to the smaller R
    assert best2.loc[32, "ppl_wiki_mean"] == pytest.approx(11.25) and best2.loc[32, "seeds"] == 2
    assert best2["exact_tie"].fillna("").to_dict() == {32: "", 48: "R=4 P=6"}
    winners = tables["screen_promotion"].set_index("d")["winner"]
    assert winners["32"] == "R=4 P=6" and winners["48"] == "R=2 P=6"
    chosen = best_single_run(_stage2_runs(), "ppl_wiki")  # what stage=benchmarks evaluates
    assert chosen == {32: {R: 4, "run_dir": "d32-P6-R4-s1"}, 48: {R: 2, "run_dir": "d48-P6-R2-s1"}}
    runs = _stage2_runs().used
    at: dict[int, dict[tuple[int, int], list[float]]] = {32: {}, 48: {}}
    for r in runs:
        at[r.params[D]].setdefault((r.params[R], r.params[P]), []).append(r.summary.value("ppl_wiki"))
    order = {d: [o.level for o in ordered(cells, require("ppl_wiki"))] for d, cells in at.items()}  # as the zoom ranks
    assert order[32][0] == (4, 6) and order[48][:2] == [(2, 6), (4, 6)]


def test_zoom_and_the_benchmarks_best_never_rank_two_recipes_together():
    """d=32's R=2 relaunched at another lr: the benchmarks' best refuses that width in one line, and zoom, asked
    for d=48 alone, still ranks it (a mix refuses only the widths it is in)."""
    mixed = _stage2_runs(lambda d, r: 1e-3 if (d, r) == (32, 2) else 3e-3)
    with pytest.raises(ConfigError) as refused:
        best_single_run(mixed, "ppl_wiki")
    assert str(refused.value) == (
        "stage.select=best: stage 2's runs at d=32 mix recipes (trainer.lr 0.001, 0.003), which it never ranks "
        "together (the analysis tables them apart): relaunch stage 2 at d=32 with one recipe"
    )
    with pytest.raises(ConfigError, match=r"^stage.select=zoom: stage 2's runs at d=32 mix recipes"):
        zoom_candidates(mixed, "ppl_wiki", [32], allowance=0.0)
    found, _ = zoom_candidates(mixed, "ppl_wiki", [48], allowance=0.0)
    # R=2, above it, and R=6: 9% behind, which two seeds per cell at a pooled s.d. of 4.3% cannot rule out
    assert {(c[R], c[P]) for c in found} == {(2, 6), (4, 6), (6, 6)}
