"""One stage the analysis cannot read or build leaves the others' outputs whole: real stages through the real
commands (two grids and a ladder whose width is in its recipe), then each damaged as a user's folder can be (a
summary.json or metrics.jsonl of an unexpected shape, a truncated stage record), and the analysis run on them.
The damaged stage is one line naming it and why; every other stage's tables match its run folders by hand; the
exit code is 0 unless --only or --decide asked for what was left out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from stages import sweep, user_stage
from test_analysis_outputs import drawn, legend_entries, overlaps

from cart_sweeps.analysis import ladder
from cart_sweeps.analysis.__main__ import main
from cart_sweeps.analysis.load import load_runs

pytestmark = pytest.mark.slow  # three real stages (~1.5 min on 2 cores), then an analysis per damage
TINY = ["scale=tiny", "model.d_model=32", "trainer.steps=6"]
LADDER = """name: wladder
rungs: [500, 1000]
max_seeds: 2
grid:
  model.n_loops: [2, 4]
  seed: [42, 137]
recipe:
  model.d_model: 32
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_cache) -> Path:
    """Two grid stages (n_loops 2,4; n_prelude 1,2) and a ladder of two rungs whose width its recipe sets."""
    root = tmp_path_factory.mktemp("isolation")
    for args in (["model.n_loops=2,4"], ["model.n_prelude=1,2"]):
        done = sweep(root, *TINY, *args)
        assert done.returncode == 0, done.stderr[-3000:]
    config = user_stage(tmp_path_factory.mktemp("cfg"), LADDER)
    done = sweep(root, "--config-dir", str(config), "stage=wladder", "scale=tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def stages(root: Path) -> tuple[str, str]:
    """(the n_loops grid, the n_prelude grid): their folders' names (adhoc-<hash>)."""
    grids = [p for p in sorted(root.iterdir()) if p.name.startswith("adhoc-")]
    by_key = {json.loads((p / "stage.json").read_text())["varied"][0]: p.name for p in grids}
    return by_key["model.n_loops"], by_key["model.n_prelude"]


def summaries(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/summary.json"))]


def analyse(root: Path, out: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["--runs", str(root), "--out", str(out), *extra])
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err
    return code, said.out, said.err


def check_grid(out: Path, root: Path, stage: str) -> None:
    """The n_loops grid's own table holds each run's ppl_austen (one seed a cell), as its summary.json says."""
    table = pd.read_csv(out / f"runs_{stage}.csv").set_index("R")["ppl_austen"]
    by_hand = {s["model"]["n_loops"]: s["ppl_austen"] for s in summaries(root / stage)}
    assert table.to_dict() == pytest.approx(by_hand) and len(by_hand) == 2


def damaged(runs: Path, tmp_path: Path, damage) -> tuple[Path, str, str]:
    """A copy of the runs root with the n_prelude grid damaged by `damage(stage folder)`."""
    root = tmp_path / "runs"
    shutil.copytree(runs, root, symlinks=True)
    good, bad = stages(root)
    damage(root / bad)
    return root, good, bad


def _summary_model_is_a_number(stage: Path) -> None:
    path = next(stage.glob("*P1*/summary.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "model": 5}))


def _metrics_line_of_a_list(stage: Path) -> None:
    with next(stage.glob("*P1*/metrics.jsonl")).open("a") as log:
        log.write('\n{"step": 3, "kind": "train", "loss": [1.0]}\n')


def _seed_a_list(stage: Path) -> None:
    path = next(stage.glob("*P1*/summary.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "seed": [42]}))


@pytest.mark.parametrize(
    "damage, why",
    [
        (_summary_model_is_a_number, "summary.json: model is 5, not an object of its settings"),
        (_metrics_line_of_a_list, "metrics.jsonl: loss is [1.0], not a number"),
        (_seed_a_list, "summary.json: seed is [42], not a number or a word"),
    ],
)
def test_a_stage_the_analysis_cannot_read_is_one_line_and_the_others_are_written(runs, tmp_path, capsys, damage, why):
    root, good, bad = damaged(runs, tmp_path, damage)
    out = tmp_path / "out"
    code, said, _ = analyse(root, out, capsys)
    assert code == 0
    lines = [line for line in said.splitlines() if line.startswith(f"left out stage {bad}: ")]
    assert len(lines) == 1 and lines[0].endswith(why), said
    check_grid(out, root, good)
    assert (out / "runs_wladder.csv").is_file() and (out / "ladder_wladder_curves.png").is_file()
    assert not (out / f"runs_{bad}.csv").exists() and not list(out.glob(f"*{bad}*"))
    found = json.loads((out / "findings.json").read_text())
    assert list(found["input"]["stages_left_out"]) == [bad] and bad not in found["stages"] and good in found["stages"]
    assert f"Stages left out, the analysis could not read them: {bad}" in (out / "report.md").read_text()


def test_asking_for_a_stage_left_out_is_said_in_the_exit_code(runs, tmp_path, capsys):
    """--only naming the left-out stage's table writes what else it asked for and exits 1; --decide of an axis
    only that stage varies is one line naming it, exit 2; asking for neither exits 0."""
    root, good, bad = damaged(runs, tmp_path, _summary_model_is_a_number)
    out = tmp_path / "out"
    code, said, err = analyse(root, out, capsys, "--only", f"runs_{bad}", f"runs_{good}")
    assert code == 1 and f"analysis: --only runs_{bad}: stage {bad} is left out (" in err, err
    check_grid(out, root, good)
    code, _, err = analyse(root, out, capsys, "--decide", "model.n_prelude")
    assert code == 2 and f"; stage {bad} is left out (" in err and len(err.splitlines()) == 1, err
    assert analyse(root, out, capsys, "--only", f"runs_{good}")[0] == 0


def test_a_truncated_stage_record_and_a_ladder_of_one_width_leave_every_table_written(runs, tmp_path, capsys):
    """The ladder's width is in its recipe (no width column); its stage record is cut short: every stage's
    tables are written, or one of them is one line naming the stage; nothing else is lost."""
    root, good, bad = damaged(runs, tmp_path, lambda stage: None)
    record = root / "wladder" / "stage.json"
    record.write_text(record.read_text()[:100])
    out = tmp_path / "out"
    code, said, _ = analyse(root, out, capsys)
    assert code == 0
    check_grid(out, root, good)
    assert (out / f"runs_{bad}.csv").is_file() and (out / "runs_wladder.csv").is_file()
    for kind in ("rungs", "agreement", "drift"):
        name = f"ladder_wladder_{kind}"
        assert (out / f"{name}.csv").is_file() or f"skipped {name}: stage wladder: " in said, said
    rungs = json.loads((out / "findings.json").read_text())["stages"]["wladder"]
    by_hand: dict[tuple[int, int], list[float]] = {}
    for s in summaries(root / "wladder"):
        by_hand.setdefault((s["trainer"]["steps"], s["model"]["n_loops"]), []).append(s["ppl_austen"])
    assert rungs["ppl_austen"] == pytest.approx(min(sum(v) / len(v) for v in by_hand.values()))


def test_the_ladder_figure_keeps_its_title_ticks_and_legend_apart(runs, tmp_path):
    """The real ladder's figure: its configurations in order, its rungs as plain numbers, nothing covered."""
    figure = drawn(ladder.curves(load_runs(runs), "wladder", "ppl_austen"), tmp_path / "ladder_wladder_curves")
    assert legend_entries(figure)[0] == ["n_loops=2", "n_loops=4"]
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["5", "10"]  # the rungs at scale=tiny
    assert overlaps(figure) == []
