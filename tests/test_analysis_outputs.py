"""Outputs that say what they hold, checked against numbers written by hand: cells marked by their seed count
(grid, best, figure), a full tie said as a tie, an undecided verdict carrying no verdict word, a legend on every
figure, the report opening with its findings, and `--out` a folder named for its input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from test_analysis import write_run

from cart_sweeps.analysis.__main__ import main
from cart_sweeps.analysis.figures import curves, figure_jobs, save, stage1_ppl_vs_r
from cart_sweeps.analysis.load import load_csv, load_runs
from cart_sweeps.analysis.report import run

SEEDS = {(1, 2): 1, (1, 4): 1, (2, 2): 1, (2, 4): 3}  # Stage 1 at d=32: (P, R) -> seeds (a replicated cell)


@pytest.fixture(scope="module")
def screen(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("screen")
    for (p, r), n in SEEDS.items():
        for seed in range(1, n + 1):
            write_run(root, "1", d=32, p=p, r=r, seed=seed)
    return root


def _austen(root: Path, label: str) -> float:
    return json.loads((root / "1" / label / "summary.json").read_text())["ppl_austen"]


def test_cells_are_marked_by_their_seed_count(screen, tmp_path):
    run(load_runs(screen), tmp_path, only=["stage1_grid", "stage1_best"])
    grid = pd.read_csv(tmp_path / "stage1_grid.csv").set_index("P")
    assert grid["seeds R=2"].tolist() == [1, 1] and grid["seeds R=4"].tolist() == [1, 3]
    mean = sum(_austen(screen, f"d32-P2-R4-s{s}") for s in (1, 2, 3)) / 3
    assert grid.loc[2, "R=4"] == pytest.approx(mean) and grid.loc[1, "R=4"] == pytest.approx(
        _austen(screen, "d32-P1-R4-s1")
    )
    best = pd.read_csv(tmp_path / "stage1_best.csv")
    cells = {(p, r): _austen(screen, f"d32-P{p}-R{r}-s1") for (p, r) in SEEDS} | {(2, 4): mean}
    p, r = min(cells, key=lambda c: (cells[c], c[1], c[0]))
    assert best[["P", "R", "seeds"]].values.tolist() == [[p, r, SEEDS[(p, r)]]]
    fig = stage1_ppl_vs_r(load_runs(screen), "ppl_austen")
    labels = {label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]}
    assert labels == {"P = 1", "P = 2", "mean of 3 seeds"}


def test_every_figure_has_a_legend_naming_each_configuration(screen, tmp_path):
    study = load_runs(screen)
    for name, job in figure_jobs(study, "ppl_austen").items():  # save() refuses a figure without labels
        try:
            assert job(tmp_path / name)
        except Exception as error:  # noqa: BLE001 (a figure this input cannot give says why)
            assert "labelled" not in str(error), name
    for column in ("loss", "rho"):
        labels = {label for ax in curves(study, "1", column).axes for label in ax.get_legend_handles_labels()[1]}
        configs = {f"P{p}-R{r}" for p, r in SEEDS}  # the seeds of a configuration share its entry
        assert configs <= labels and len(labels - configs) == (1 if column == "rho" else 0), labels


def _variable_r(tmp: Path, acc: dict[int, float]) -> Path:
    """A variable-R stage at d=32 trained at R=4, evaluated at each R of `acc` (its accuracy), two source seeds."""
    rows = [
        {"stage": "variable_r", "model": "cart", "variant": "base", "d_model": 32, "n_prelude": 2, "n_loops": 4,
         "trained_n_loops": 4, "eval_n_loops": r, "seed": s, "ppl_wiki": 50.0 + r + s, "bench_cart_lastword_acc": a}
        for r, a in acc.items() for s in (1, 2)
    ]  # fmt: skip
    path = tmp / "variable_r.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_a_full_tie_is_said_tied_never_a_pick(tmp_path):
    report = run(load_csv(_variable_r(tmp_path, {2: 0.25, 4: 0.25, 6: 0.25})), tmp_path / "tie")
    found = report.findings["variable_r_bench"]["32"]
    assert found["best_R"] == {"bench_cart_lastword_acc": None}
    assert found["tied_R"] == {"bench_cart_lastword_acc": [2, 4, 6]} and found["every_R_tied"]
    assert "cart_lastword_acc tied at every R" in report.summary and "best at R=2" not in report.summary
    clear = run(load_csv(_variable_r(tmp_path, {2: 0.25, 4: 0.30, 6: 0.25})), tmp_path / "clear")
    assert clear.findings["variable_r_bench"]["32"]["best_R"] == {"bench_cart_lastword_acc": 4}
    assert "cart_lastword_acc best at R=4" in clear.summary


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_an_undecided_verdict_carries_no_verdict_word(tmp_path):
    """The paper's ablations are one seed each against the base's noise: whatever is undecided has no choice."""
    report = run(load_csv(Path(__file__).parent / "fixtures" / "paper_results.csv"), tmp_path)
    verdicts = [c for c in report.findings["decisions"] if c["claim"] in ("ablation", "parity", "reversal")]
    undecided = [c for c in verdicts if not c["decided"]]
    assert undecided and all(c["choice"] is None and c["leaning"] is not None for c in undecided)
    assert all(c["choice"] == c["leaning"] is not None for c in verdicts if c["decided"])
    best_r = [c for c in report.findings["decisions"] if c["claim"] == "best_R" and not c["decided"]]
    assert best_r and all(c["choice"] is not None for c in best_r)  # an option, its point pick: no verdict word
    head, _, listed = (tmp_path / "report.md").read_text().partition("## Findings\n\n")
    assert head == "# CART study: regenerated tables\n\n" and listed.startswith("### Stage 1\n\n- ")
    said = [line[2:] for line in listed.split("\n## ")[0].splitlines() if line.startswith("- ")]
    assert " ".join(said) == report.summary  # the findings one per line under their stage


def test_out_defaults_to_a_folder_named_for_the_input(screen, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    csv = _variable_r(tmp_path, {2: 0.25, 4: 0.30})
    assert main(["--from-csv", str(csv)]) == 0
    assert main(["--runs", str(screen), "--only", "stage1_grid"]) == 0
    out = tmp_path / "analysis" / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(["variable_r", screen.name])
    assert (out / "variable_r" / "findings.json").exists() and (out / screen.name / "stage1_grid.csv").exists()
    assert main(["--runs", str(screen), "--only", "stage1_best"]) == 0  # the same input again: its folder
    assert (out / screen.name / "stage1_grid.csv").exists() and (out / screen.name / "stage1_best.csv").exists()


def test_only_takes_the_start_of_names_and_keeps_the_rest_of_out(screen, tmp_path):
    """--only stage1_p runs: every name starting so (as --help says), and only they are rewritten."""
    out = tmp_path / "out"
    assert main(["--runs", str(screen), "--out", str(out), "--only", "stage1_grid"]) == 0
    grid = (out / "stage1_grid.csv").read_bytes()
    assert main(["--runs", str(screen), "--out", str(out), "--only", "stage1_p", "runs"]) == 0
    built = {"stage1_p_ordering.csv", "stage1_ppl_vs_R.png", "runs_1.csv", "stage1_grid.csv"}
    assert built <= {p.name for p in out.iterdir()} and not (out / "stage1_best.csv").exists()
    assert (out / "stage1_grid.csv").read_bytes() == grid
    assert pd.read_csv(out / "runs_1.csv")["seeds"].sum() == sum(SEEDS.values())


WARMUPS = [1, 2, 3, 5, 7, 10, 12, 15, 20, 25, 30, 40, 50, 60, 70, 80, 90, 100, 120, 150, 200, 250, 300, 400]


def drawn(figure: Figure, stem: Path) -> Figure:
    """`figure` as the analysis saves it (its legend added, laid out, written to `stem`.png and .pdf)."""
    assert save(lambda: figure, stem) == [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    return figure


def legend_entries(figure: Figure) -> tuple[list[str], set[tuple[str, str]]]:
    """The figure's legend: its labels in order, and the (colour, line style) pairs of its lines."""
    (legend,) = figure.legends
    lines = [h for h in legend.legend_handles if isinstance(h, Line2D) and h.get_linestyle() != "None"]
    return [t.get_text() for t in legend.get_texts()], {(to_hex(h.get_color()), h.get_linestyle()) for h in lines}


def overlaps(figure: Figure) -> list[str]:
    """Which of the figure's texts and panels cover one another: its title, each panel's title and axis labels,
    the legend, and the panels themselves."""
    canvas = FigureCanvasAgg(figure)  # laid out and drawn as savefig did, at the figure's size
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = {"legend": figure.legends[0].get_window_extent(renderer)}
    if figure._suptitle is not None:
        boxes["title"] = figure._suptitle.get_window_extent(renderer)
    for i, ax in enumerate(figure.axes):
        boxes[f"panel {i}"] = ax.get_window_extent(renderer)
        for part, text in (("title", ax.title), ("x label", ax.xaxis.label), ("y label", ax.yaxis.label)):
            if text.get_text():
                boxes[f"panel {i} {part}"] = text.get_window_extent(renderer)
        low, high = sorted(ax.get_xlim())
        placed = [zip(ax.get_xticks(minor=m), ax.get_xticklabels(minor=m), strict=True) for m in (False, True)]
        ticks = [t for pairs in placed for at, t in pairs if low <= at <= high and t.get_text()]  # drawn ones
        boxes |= {f"panel {i} x tick {t.get_text()}": t.get_window_extent(renderer) for t in ticks}
    names = list(boxes)
    return [
        f"{a} / {b}"
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if not (a.startswith(b) or b.startswith(a))  # a panel and its own labels
        and not (a.startswith("panel") and b.startswith("panel") and a.split()[1] != b.split()[1] and "label" in a + b)
        and boxes[a].overlaps(boxes[b])
    ]


@pytest.mark.slow  # 24 run folders and a figure drawn (~5-18 s on 2 shared cores)
def test_a_figure_of_24_runs_lists_them_in_natural_order_each_in_its_own_style(tmp_path):
    """24 runs of one stage, warm-up 1 to 400: the loss figure's legend reads them in numeric order, no two
    share a colour and a line style, and no title, label or legend covers another or a panel."""
    for warmup in WARMUPS:
        write_run(tmp_path / "runs", "warm", d=32, variant=f"warmup{warmup}")
    study = load_runs(tmp_path / "runs")
    figure = drawn(curves(study, "warm", "loss"), tmp_path / "loss_warm")
    labels, styles = legend_entries(figure)
    assert labels == [f"P2-R4-warmup{w}" for w in WARMUPS]
    assert len(styles) == len(WARMUPS)
    assert overlaps(figure) == []


DRAWN = """\
import json, sys
from cart_sweeps.analysis.figures import curves
from cart_sweeps.analysis.load import load_runs
figure = curves(load_runs(sys.argv[1]), "mixed", "rho")
print(json.dumps([[list(map(float, line.get_ydata()))[-1] for line in ax.lines if line.get_color() == "k"]
                  for ax in figure.axes]))
"""


@pytest.mark.slow  # six processes, one per hash seed
def test_a_rho_figure_draws_recipes_of_one_length_in_one_order_whatever_the_hash_seed(tmp_path):
    """Two recipes of one length in a width (a relaunch with another weight decay) drew their weight-decay-only
    curves in a set's order, which Python's hash seed changes: rho_<stage>.png differed between two runs of the
    same analysis on the same runs."""
    for seed, decay in ((1, 0.1), (2, 0.05)):
        write_run(tmp_path / "runs", "mixed", d=32, seed=seed)
        (summary,) = (tmp_path / "runs" / "mixed").glob(f"*-s{seed}/summary.json")
        written = json.loads(summary.read_text())
        written["trainer"]["weight_decay"] = decay
        summary.write_text(json.dumps(written))
    orders = set()
    for hash_seed in range(6):
        env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
        drawn = subprocess.run(
            [sys.executable, "-c", DRAWN, str(tmp_path / "runs")], env=env, capture_output=True, text=True, check=True
        )
        orders.add(drawn.stdout)
    assert len(orders) == 1, orders
    (order,) = orders
    assert len(json.loads(order)[0]) == 2  # both recipes' curves drawn
