"""Several objectives: a stage of sweep.metrics is an Optuna multi-objective study told each objective, its
Pareto table is the front of its run folders' values, and the paper's grid gets a quality-against-compute
front per width. Real commands, tiny scale; fronts checked against fronts computed by hand."""

from __future__ import annotations

import json

import optuna
import pandas as pd
import pytest
from stages import sweep, user_stage
from test_axes import REPO, TINY, analysis, command, studies

TWO = ["sweep.metrics=[ppl_austen,tokens_per_s]"]
STAGE = """\
name: two
grid:
  model.n_loops: [1, 3]
  seed: [1, 2]
recipe:
  model.d_model: 256
  model.n_prelude: 1
  trainer.steps: 3000
"""


def test_a_csv_s_stage1_cells_are_costed_at_the_composed_screen_stage_s_recipe():
    """The analysis composes nothing: its paper screen recipe (pareto.PAPER_SCREEN_*) is the shipped screen stage's,
    composed here at scale=paper, so a results CSV's cells cost what that stage's runs record."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    from cart_sweeps.analysis import pareto
    from cart_sweeps.compose import compose_config
    from cart_sweeps.roles import stage_of

    cfg = compose_config([f"stage={stage_of('screen')}"])
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model |= {k.removeprefix("model."): v for k, v in cfg.stage.recipe.items() if k.startswith("model.")}
    ours = asdict(pareto.PAPER_SCREEN_MODEL)
    assert {k: v for k, v in model.items() if k not in pareto.tables.CONFIG} == {
        k: v for k, v in ours.items() if k not in pareto.tables.CONFIG
    }
    assert cfg.stage.recipe.get("trainer.seq_len", cfg.trainer.seq_len) == pareto.PAPER_SCREEN_SEQ_LEN


def by_hand(points: dict[int, tuple[float, float]]) -> set[int]:
    """The configurations no other has a perplexity as low and a throughput as high, one of them strictly."""
    return {
        k
        for k, (ppl, tps) in points.items()
        if not any(p <= ppl and t >= tps and (p, t) != (ppl, tps) for j, (p, t) in points.items() if j != k)
    }


@pytest.mark.slow
def test_a_two_objective_stage_is_a_multi_objective_study_and_its_pareto_table_is_the_hand_front(tmp_path, data_cache):
    cfg, runs = user_stage(tmp_path, STAGE), tmp_path / "runs"
    done = sweep(runs, "--config-dir", str(cfg), "stage=two", *TINY, *TWO)
    assert done.returncode == 0, done.stderr[-3000:]
    study = studies(runs, "two")["two"]
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE]
    assert study.metric_names == ["ppl_austen", "tokens_per_s"]
    summaries = [json.loads(p.read_text()) for p in (runs / "two").glob("*/summary.json")]
    assert len(summaries) == 4
    told = {t.user_attrs["run_id"]: t.values for t in study.trials}
    for s in summaries:  # each trial told both objectives, as its run folder holds them
        assert told[s["run_id"]] == [s["ppl_austen"], s["tokens_per_s"]]

    again = sweep(runs, "--config-dir", str(cfg), "stage=two", *TINY, *TWO)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 done, skipped" in again.stdout and "0 completed" in again.stdout + again.stderr  # trains nothing
    assert len(studies(runs, "two")["two"].trials) == 4

    seeds: dict[int, list[tuple[float, float]]] = {}
    for s in summaries:
        seeds.setdefault(s["model"]["n_loops"], []).append((s["ppl_austen"], s["tokens_per_s"]))
    means = {r: (sum(p for p, _ in v) / len(v), sum(t for _, t in v) / len(v)) for r, v in seeds.items()}
    analysis(runs, tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "pareto_two.csv")
    assert set(table["R"]) == by_hand(means)
    for _, row in table.iterrows():
        ppl, tps = means[row["R"]]
        assert row["ppl_austen"] == pytest.approx(ppl) and row["tokens_per_s"] == pytest.approx(tps)
        assert row["ppl_austen_rank"] == 1 + sum(p < ppl for p, _ in means.values())
        assert row["tokens_per_s_rank"] == 1 + sum(t > tps for _, t in means.values())
        assert row["seeds"] == 2
    assert list(table["ppl_austen"]) == sorted(table["ppl_austen"])  # best first by the first objective
    assert (tmp_path / "out" / "pareto_two_plot.png").stat().st_size > 0
    header, _, *rows = [
        line.strip("|").split("|")
        for line in (tmp_path / "out" / "pareto_two.md").read_text().splitlines()
        if line.startswith("|")  # the table, not the line naming its runs
    ]
    column = {name.strip(): [row[i].strip() for row in rows] for i, name in enumerate(header)}
    assert column["ppl_austen"][0].startswith("**")  # each objective's best in bold, its rank never
    assert not any(c.startswith("**") for c in column["ppl_austen_rank"] + column["tokens_per_s_rank"])


SEARCH = """\
name: look
search:
  trainer.lr: {low: 1.0e-3, high: 1.0e-2, log: true}
recipe:
  seed: 42
  model.d_model: 256
"""


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (
            ["sweep.pruner=median"],
            "sweep.pruner=median with sweep.metrics=[ppl_austen,tokens_per_s]: Optuna cannot prune a trial of "
            "several objectives",
        ),
        (
            ["sweep.direction=minimize"],
            "sweep.direction=minimize names one direction, and sweep.metrics=[ppl_austen,tokens_per_s] are several",
        ),
        (["sweep.metric=ppl_bible"], "sweep.metric=ppl_bible and sweep.metrics=[ppl_austen,tokens_per_s]: with "),
        (["sweep.metrics=[ppl_austen,ppl_austen]"], "sweep.metrics=[ppl_austen,ppl_austen] names ppl_austen twice"),
        (["sweep.metrics=[ppl_austen,speed]"], "speed is not a metric whose direction is known"),
    ],
)
def test_a_multi_objective_mistake_is_one_line_before_anything_launches(tmp_path, settings, says):
    cfg = user_stage(tmp_path, SEARCH)
    search = ["sweep.sampler=tpe", "sweep.n_trials=3", "sweep.startup_trials=1"]
    done = sweep(tmp_path / "runs", "--config-dir", str(cfg), "stage=look", *TINY, *search, *TWO, *settings)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and says in line
    assert not (tmp_path / "runs" / "look").exists()


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_the_paper_grid_s_compute_front_per_width_is_the_hand_front(tmp_path):
    fixture = REPO / "tests" / "fixtures" / "paper_results.csv"
    out = tmp_path / "out"
    done = command(
        tmp_path,
        "cart_sweeps.analysis",
        "--from-csv",
        str(fixture),
        "--out",
        str(out),
        "--only",
        "stage1_compute_front",
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out / "stage1_compute_front.csv")
    rows = pd.read_csv(fixture)
    rows = rows[rows["stage"].astype(str) == "1"]
    expected = set()
    assert set(rows["n_prelude"]) == {6}  # one P: at one width, more loops cost more, so a cell is on the front
    for _, width in rows.groupby("d_model"):  # when every cell of fewer loops (cheaper) is worse
        for _, cell in width.iterrows():
            cheaper = width[(width["n_prelude"] == cell["n_prelude"]) & (width["n_loops"] < cell["n_loops"])]
            if (cheaper["ppl_wiki"] > cell["ppl_wiki"]).all():
                expected.add((cell["d_model"], cell["n_prelude"], cell["n_loops"]))
    assert set(zip(table["d"], table["P"], table["R"], strict=True)) == expected
    assert (256, 6, 8) not in expected  # the grid's one cell that more compute made worse
    for _, width in table.groupby("d"):  # cheapest first, and FLOPs grow with the loops
        assert list(width["R"]) == sorted(width["R"]) and width["gflops_per_token"].is_monotonic_increasing
    assert (out / "stage1_compute_front_plot.png").stat().st_size > 0


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_the_ledger_tells_each_objective_and_reads_them_back_in_either_storage(tmp_path, storage):
    from optuna.distributions import IntDistribution

    from cart_sweeps.record.summary import RunSummary
    from cart_sweeps.stagerecord.ledger import Ledger
    from cart_sweeps.stagerecord.trials import all_trials
    from cart_sweeps.status import RunStatus

    both = ["ppl_austen", "tokens_per_s"]
    ledger = Ledger.open(tmp_path, "two", storage, objective={"metric": both[0], "metrics": both})
    assert ledger.study.study_name == "two" and len(ledger.study.directions) == 2
    seeds = {"seed": IntDistribution(0, 9)}
    done = ledger.start({"seed": 1}, seeds, {"run_id": "a"})
    summary = RunSummary(RunStatus.COMPLETED, metrics={"ppl_austen": 40.0}, tokens_per_s=900.0, step=4)
    assert ledger.finish(done, summary, both) == RunStatus.COMPLETED
    nan = ledger.start({"seed": 2}, seeds, {"run_id": "b"})  # completed, its second objective not finite: failed
    broken = RunSummary(RunStatus.COMPLETED, metrics={"ppl_austen": 41.0}, tokens_per_s=float("nan"))
    assert ledger.finish(nan, broken, both).is_result is False
    short = ledger.start({"seed": 3}, seeds, {"run_id": "c"})  # completed without it: done, not comparable
    assert ledger.finish(short, RunSummary(RunStatus.COMPLETED, metrics={"ppl_austen": 41.0}), both).is_result
    trials = all_trials(Ledger.read(tmp_path, "two", storage).study)
    assert [t.values for t in trials] == [[40.0, 900.0], None, None]
    assert "completed without a finite tokens_per_s" in trials[1].user_attrs["error"]
    assert trials[2].user_attrs["not_comparable"] == "tokens_per_s" and trials[2].user_attrs["status"] == "completed"
    # another list of objectives is another study; the same list opens the first again
    assert (
        Ledger.open(tmp_path, "two", storage, objective={"metric": both[0], "metrics": both[::-1]}).study.study_name
        != "two"
    )
    assert (
        Ledger.open(tmp_path, "two", storage, objective={"metric": both[0], "metrics": both}).study.study_name == "two"
    )
