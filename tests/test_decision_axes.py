"""A decision axis is whatever the stage varies, typed: through the real analysis command, on results CSVs made in
tests/fixtures/paper_results.csv's format and on real tiny stages, each decision checked against one computed here
by hand from the CSV rows or the run folders' summary.json (log-perplexity seeds, the seed s.d. pooled over the
options compared, two-sided t-tests from scipy's t distribution, Holm's step-down: docs/statistics.md).

- a run without a value of an axis (a dense run's R, a CART run's dense depth, a blank in a CSV) is no option:
  left out of that axis's decision and said, never a crash;
- an integer axis stays an integer (d=64, never 64.0) in tables, CSVs, sentences and findings.json;
- a ladder's horizon (trainer.steps over stage.rungs) is a rung, held, never decided;
- an undecided decision names each option the seeds cannot tell from the pick with its adjusted p, the closest to
  decided first, and findings.json keeps every comparison's margin, interval, p and adjusted p;
- report.md lists the findings one per line under their stage.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from stages import sweep

from cart_sweeps.analysis.__main__ import main

FIXTURE = Path(__file__).parent / "fixtures" / "paper_results.csv"
HEADER = "stage,model,variant,d_model,n_prelude,n_loops,n_layers,seed,step,ppl_wiki\n"


def by_hand(values: dict, alpha: float = 0.05) -> tuple[object, list[dict]]:
    """(the best level, its comparison with each other level in rank order: over, pct, ci_pct, p, p_adjusted) of a
    best-of-k over perplexity seeds: log scale, pooled s.d., two-sided t, Holm."""
    from scipy import stats

    logs = {k: np.log(np.asarray(v, dtype=float)) for k, v in values.items()}
    order = sorted(logs, key=lambda k: np.mean(values[k]))
    df = sum(len(v) - 1 for v in logs.values())
    sd = math.sqrt(sum((len(v) - 1) * v.var(ddof=1) for v in logs.values()) / df)
    best = logs[order[0]]
    out = []
    for other in order[1:]:
        diff = logs[other].mean() - best.mean()
        se = sd * math.sqrt(1 / len(best) + 1 / len(logs[other]))
        half = stats.t.ppf(1 - alpha / 2, df) * se
        out.append(
            {
                "over": other,
                "pct": 100 * math.expm1(diff),
                "ci_pct": [100 * math.expm1(diff - half), 100 * math.expm1(diff + half)],
                "p": min(1.0, 2 * stats.t.sf(diff / se, df)),
            }
        )
    ranked = sorted(range(len(out)), key=lambda i: out[i]["p"])
    running = 0.0
    for step, i in enumerate(ranked):  # Holm's step-down
        running = max(running, (len(out) - step) * out[i]["p"])
        out[i]["p_adjusted"] = min(1.0, running)
    return order[0], out


def analyse(csv_path: Path, out: Path, *only: str) -> dict:
    """`python -m cart_sweeps.analysis --from-csv` (its entry point), and the findings it wrote."""
    assert main(["--from-csv", str(csv_path), "--out", str(out), *(["--only", *only] if only else [])]) == 0
    return json.loads((out / "findings.json").read_text())


def text_table(path: Path) -> list[dict[str, str]]:
    """A written CSV as its text: what a reader of the file sees (64, never 64.0)."""
    with path.open() as file:
        return list(csv.DictReader(file))


def findings_section(report: Path) -> str:
    return report.read_text().partition("## Findings\n\n")[2].split("\n## ")[0]


def test_a_parity_stage_whose_cart_rows_have_no_dense_depth_is_decided_not_a_traceback(tmp_path):
    """Before: `boolean value of NA is ambiguous` in stage_decisions.edge. The published numbers plus a parity stage
    whose CART rows carry no dense depth (n_layers blank), as the paper's parity table has them."""
    dense = {7: [41.2, 41.3, 41.5], 14: [39.2, 39.3, 39.5]}
    seeds = (42, 137, 271)
    base = {"stage": "parity", "variant": "base", "d_model": 256, "step": 3000}
    rows = [base | {"model": "cart", "n_prelude": 6, "n_loops": 8, "seed": s, "ppl_wiki": v} for s, v in
            zip(seeds, (40.2, 40.3, 40.4), strict=True)]  # fmt: skip
    rows += [base | {"model": "dense", "n_layers": L, "seed": s, "ppl_wiki": v} for L, vs in dense.items() for s, v in
             zip(seeds, vs, strict=True)]  # fmt: skip
    path = tmp_path / "published_with_parity.csv"
    pd.concat([pd.read_csv(FIXTURE, dtype=str), pd.DataFrame(rows).astype("Int64", errors="ignore")]).to_csv(
        path, index=False
    )

    found = analyse(path, tmp_path / "out", "runs_parity")
    records = {r["cell"]["model"]: r for r in found["stage_decisions"]["parity"] if r["axis"] == "n_layers"}
    choice, compared = by_hand(dense)
    depth = records["dense"]
    assert (depth["choice"], depth["decided"], depth["no_level"]) == (choice, True, 0)
    assert depth["p_value"] == pytest.approx(compared[0]["p_adjusted"], rel=1e-9)
    assert depth["said"] == (
        f"Stage parity at model=dense: L=14 is the best L; the runner-up L=7 is {compared[0]['pct']:.2f}% worse "
        f"(95% CI {compared[0]['ci_pct'][0]:.2f} to {compared[0]['ci_pct'][1]:.2f}), "
        f"p={compared[0]['p_adjusted']:.2g}; L=14 is the grid's largest value."
    )
    cart_depth = records["cart"]  # CART's three runs have no dense depth: no option, said, not decided
    assert (cart_depth["choice"], cart_depth["decided"], cart_depth["no_level"]) == (None, False, 3)
    assert cart_depth["said"] == "Stage parity at model=cart: no L to compare (its 3 runs have none)."
    table = {(r["model"], r["L"]): r["L_best"] for r in text_table(tmp_path / "out" / "runs_parity.csv")}
    assert table == {("dense", "14"): "best", ("dense", "7"): "", ("cart", ""): ""}


@pytest.fixture(scope="module")
def one_r_blank(tmp_path_factory) -> tuple[pd.DataFrame, Path, dict, str]:
    """The published numbers with one Stage-2 row's R blanked (d=256, R=10, seed 271), analysed: (the CSV's rows as
    text, the output folder, its findings, the paragraph the command printed)."""
    tmp = tmp_path_factory.mktemp("blank_r")
    frame = pd.read_csv(FIXTURE, dtype=str, keep_default_na=False)
    lost = (frame["stage"] == "2") & (frame["d_model"] == "256") & (frame["n_loops"] == "10") & (frame["seed"] == "271")
    frame.loc[lost, "n_loops"] = ""
    path = tmp / "published_one_R_blank.csv"
    frame.to_csv(path, index=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        found = analyse(path, tmp / "out", "stage2_best", "reversal", "runs_2")
    return frame, tmp / "out", found, printed.getvalue().strip().splitlines()[-1]


def test_rows_without_an_R_are_left_out_of_the_R_decisions_and_said(one_r_blank):
    """Before, the reversal claim crashed on the blank R (`boolean value of NA is ambiguous`); now that run is no
    option of any R decision at its width, which says it left one run out."""
    frame, out, found, _ = one_r_blank
    rows = frame[(frame["stage"] == "2") & (frame["d_model"] == "256") & (frame["n_loops"] != "")]
    values = {int(r): [float(v) for v in g["ppl_wiki"]] for r, g in rows.groupby("n_loops")}
    choice, compared = by_hand(values)
    [claim] = [c for c in found["decisions"] if c["claim"] == "best_R" and c["d"] == 256 and c["stage"] == "2"]
    assert (claim["choice"], claim["no_level"], claim["seeds"]) == (choice, 1, {"8": 3, "10": 2, "6": 3})
    assert claim["p_value"] == pytest.approx(max(c["p_adjusted"] for c in compared), rel=1e-9)
    [reversal] = [c for c in found["decisions"] if c["claim"] == "reversal" and c["d"] == 256]
    assert reversal["decided"] and reversal["choice"] == "reversed"
    [own] = [r for r in found["stage_decisions"]["2"] if r["axis"] == "n_loops" and r["cell"]["d_model"] == 256]
    assert own["no_level"] == 1 and "; 1 run has no R (left out)" in own["said"]
    assert "1 run has no R (left out)" in (out / "report.md").read_text()
    blank = [r for r in text_table(out / "runs_2.csv") if r["R"] == ""]
    assert [(r["d"], r["seeds"], r["R_best"]) for r in blank] == [("256", "1", "")]


NEAR = {2: [100.0, 101.0, 102.0], 4: [100.6, 101.6, 102.6], 8: [102.3, 103.3, 104.3]}  # R=8: Holm p about 0.06


def test_an_undecided_integer_axis_names_its_near_decision_with_its_adjusted_p(tmp_path, capsys):
    """A stage of one's own varying R over 2, 4, 8 with 3 seeds each, beside a dense stage whose rows have no R:
    R=8 is close to decided against R=2 (Holm p about 0.06), R=4 is not (about 0.49). Before, the sentence said
    only the largest p (0.49), and R read as an integer only by luck of the column."""
    rows = [f"mine,cart,base,64,2,{r},,{s},100,{v}" for r, vs in NEAR.items() for s, v in enumerate(vs, 1)]
    dense = {2: (110.1, 110.9), 3: (108.2, 109.1)}
    rows += [f"other,dense,base,64,,,{L},{s},100,{v}" for L, vs in dense.items() for s, v in enumerate(vs, 1)]
    path = tmp_path / "near.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")

    found = analyse(path, tmp_path / "out")
    [record] = found["stage_decisions"]["mine"]
    choice, compared = by_hand(NEAR)
    assert (record["choice"], record["decided"], record["tied"]) == (choice, False, [4, 8])
    assert type(record["choice"]) is int and all(type(t) is int for t in record["tied"])
    assert [c["over"] for c in record["comparisons"]] == [c["over"] for c in compared] == [4, 8]
    for got, hand in zip(record["comparisons"], compared, strict=True):
        assert type(got["over"]) is int
        assert (got["p"], got["p_adjusted"]) == pytest.approx((hand["p"], hand["p_adjusted"]), rel=1e-9)
        assert [got["pct"], *got["ci_pct"]] == pytest.approx([hand["pct"], *hand["ci_pct"]], abs=1e-6)  # 6 places
    near, far = sorted(compared, key=lambda c: c["p_adjusted"])
    assert 0.05 < near["p_adjusted"] < 0.1 < far["p_adjusted"]  # the data as designed
    said = (
        f"Stage mine: the best R is undecided: R=2 is not told from R=8 ({near['pct']:.2f}% higher, adjusted "
        f"p={near['p_adjusted']:.2g}) or R=4 ({far['pct']:.2f}% higher, adjusted p={far['p_adjusted']:.2g}) at "
        "alpha=0.05 with 3 seeds each; R=2 is the grid's smallest value."
    )
    assert record["said"] == said and said in capsys.readouterr().out
    assert [r["R"] for r in text_table(tmp_path / "out" / "runs_mine.csv")] == ["2", "4", "8"]
    [depth] = found["stage_decisions"]["other"]
    assert depth["choice"] == 3 and "L=3 is not told from L=2 (" in depth["said"]


def test_report_md_lists_the_findings_one_per_line_under_their_stage(one_r_blank):
    """Before, the findings were one paragraph of about 3,000 characters."""
    _, out, found, summary = one_r_blank
    listed = findings_section(out / "report.md")
    headings = re.findall(r"^### (.+)$", listed, flags=re.M)
    assert headings == ["Stage 2"]  # (--only: no notes)
    stage2 = listed.partition("### Stage 2\n\n")[2].partition("\n### ")[0]
    bullets = [line.removeprefix("- ") for line in stage2.splitlines() if line]
    assert all(line.startswith("- ") for line in stage2.splitlines() if line)
    assert [r["said"] for r in found["stage_decisions"]["2"]] == bullets[-len(found["stage_decisions"]["2"]) :]
    assert any(b.startswith("Stage 2, d=768 P=6: undecided") for b in bullets)
    every = [line.removeprefix("- ") for line in listed.splitlines() if line.startswith("- ")]
    assert " ".join(every) == summary  # the same findings as the printed paragraph, each once


SLOW_STAGE = """\
name: ints
numbers: own
grid:
  model.d_model: [32, 64]
  seed: [1, 2]
recipe:
  model.n_prelude: 1
  model.n_loops: 2
  trainer.steps: 4
  trainer.warmup_steps: 1
"""
LADDER = ["stage=ladder", "scale=tiny", "model.d_model=256", "model.n_loops=2,8", "model.n_prelude=6"]
LADDER += ["stage.rungs=[500,1000]", "stage.max_seeds=2"]


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory, data_cache) -> tuple[Path, dict]:
    """A tiny ladder (R=2 and R=8 at 5 and 10 steps, 2 seeds) and a stage of one's own over d, in one runs folder:
    each stage's rows lack the other's axes, which made pandas' columns of integers float ones (d=64.0, R=2.0)."""
    base = tmp_path_factory.mktemp("axes")
    (base / "cfg" / "stage").mkdir(parents=True)
    (base / "cfg" / "stage" / "ints.yaml").write_text(SLOW_STAGE)
    runs = base / "runs"
    for args in (LADDER, ["--config-dir", str(base / "cfg"), "stage=ints", "scale=tiny"]):
        done = sweep(runs, *args)
        assert done.returncode == 0, done.stderr[-3000:]
    assert main(["--runs", str(runs), "--out", str(base / "out")]) == 0
    return base, json.loads((base / "out" / "findings.json").read_text())


def summaries(runs: Path, stage: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in (runs / stage).glob("*/summary.json")]


@pytest.mark.slow
def test_integer_axes_stay_integers_across_stages(two_stages):
    base, found = two_stages
    ran = summaries(base / "runs", "ints")
    values: dict[int, list[float]] = {}
    for s in ran:
        values.setdefault(s["model"]["d_model"], []).append(s["ppl_austen"])
    choice, compared = by_hand(values)
    [record] = found["stage_decisions"]["ints"]
    assert record["choice"] == choice and type(record["choice"]) is int
    assert record["p_value"] == pytest.approx(max(c["p_adjusted"] for c in compared), rel=1e-6)
    assert re.search(r"d=\d+ ", record["said"]) and not re.search(r"=\d+\.0\b", record["said"])
    assert {r["d"] for r in text_table(base / "out" / "runs_ints.csv")} == {"32", "64"}
    ladder = text_table(base / "out" / "runs_ladder.csv")
    assert {r["R"] for r in ladder} == {"2", "8"} and {r["steps"] for r in ladder} == {"5", "10"}
    assert type(found["stages"]["ints"]["d"]) is int


@pytest.mark.slow
def test_a_ladders_horizon_is_held_at_each_rung_never_decided(two_stages, capsys):
    base, found = two_stages
    asked = ["--runs", str(base / "runs"), "--out", str(base / "asked"), "--decide", "trainer.steps"]
    assert main(asked) == 2 and "a ladder's horizon is a rung, not a choice" in capsys.readouterr().err
    records = found["stage_decisions"]["ladder"]
    assert {r["axis"] for r in records} == {"model.n_loops"}  # never trainer.steps
    looks = json.loads((base / "runs" / "ladder" / "stage.json").read_text())["looks"]
    by_rung: dict[int, dict[int, list[float]]] = {}
    for s in summaries(base / "runs", "ladder"):
        by_rung.setdefault(s["trainer"]["steps"], {}).setdefault(s["model"]["n_loops"], []).append(s["ppl_austen"])
    assert {r["cell"]["trainer.steps"] for r in records} == set(by_rung) == {5, 10}
    for record in records:
        steps = record["cell"]["trainer.steps"]
        assert type(steps) is int and record["said"].startswith(f"Stage ladder at steps={steps}: ")
        values = by_rung[steps]
        assert record["alpha"] == pytest.approx(0.05 / looks)
        if len(values) == 1:  # the ladder dropped the other R at the first rung
            assert record["comparisons"] == [] and f"only R={record['choice']} ran" in record["said"]
            continue
        choice, compared = by_hand(values, 0.05 / looks)
        assert record["choice"] == choice
        assert record["comparisons"][0]["p_adjusted"] == pytest.approx(compared[0]["p_adjusted"], rel=1e-6)
        assert record["decided"] == (compared[0]["p_adjusted"] <= 0.05 / looks)
    listed = findings_section(base / "out" / "report.md")
    assert "### Stage ladder\n\n" + "".join(f"- {r['said']}\n" for r in records) in listed
    assert "### Stage ints\n\n" + "".join(f"- {r['said']}\n" for r in found["stage_decisions"]["ints"]) in listed
