"""The analysis's input checked and its output written whole: every fault caused for real (a bad results CSV, a
summary without the ranking metric, a full disk, a read-only mount, a kill at the worst moment), then the real
command. A user's mistake is one line on stderr and exit 2, and leaves the previous analysis as it was."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from stages import read_only, small_disk, wait_for, with_fault
from test_analysis import write_run

from cart_sweeps.analysis.__main__ import main
from cart_sweeps.analysis.load import load_csv

PAPER = Path(__file__).parent / "fixtures" / "paper_results.csv"
ROOT = Path(__file__).parents[1]


def paper() -> pd.DataFrame:
    """The published results as text; row i is line i + 2 of a CSV written from it."""
    return pd.read_csv(PAPER, dtype=str, keep_default_na=False)


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("analysis: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> Path:
    """A folder holding an earlier analysis (one table, findings.json, report.md)."""
    out = tmp_path_factory.mktemp("previous") / "out"
    assert main(["--from-csv", str(PAPER), "--out", str(out), "--only", "stage1_best"]) == 0
    return out


@pytest.fixture
def refused(previous, tmp_path, capsys):
    """Analyse a CSV into a copy of the earlier analysis: exit 2, one line (returned), the copy as it was."""

    def analyse(csv: Path) -> str:
        out = tmp_path / "out"
        shutil.copytree(previous, out)
        before = contents(out)
        capsys.readouterr()
        assert main(["--from-csv", str(csv), "--out", str(out)]) == 2
        err = one_line(capsys)
        assert contents(out) == before
        return err

    return analyse


def test_a_row_with_a_field_too_many_is_one_line(refused, tmp_path):
    csv = tmp_path / "extra.csv"
    paper().to_csv(csv, index=False)
    lines = csv.read_text().splitlines()
    lines[6] += ",extra"
    csv.write_text("\n".join(lines) + "\n")
    assert refused(csv) == f"analysis: {csv} line 7: 15 fields, where the header has 14"


@pytest.mark.parametrize(
    "column, value, says",
    [
        ("ppl_wiki", "abc", "ppl_wiki 'abc' is not a number"),
        ("seed", "forty-two", "seed 'forty-two' is not a whole number"),
        ("n_loops", "2.5", "n_loops '2.5' is not a whole number"),
        ("rho", "high", "rho 'high' is not a number"),
        ("seed", "nan", "seed 'nan' is not a whole number"),  # was a seed of NaN, tabled
        ("seed", "9" * 23, f"seed '{'9' * 23}' is not a whole number of at most 18 digits"),  # was a TypeError
        ("stage", "../../x", "stage '../../x' cannot name its output files (runs_<stage>.csv); use at most 128"),
        ("stage", "a/b", "stage 'a/b' cannot name its output files (runs_<stage>.csv); use at most 128"),
    ],
)
def test_text_in_a_numeric_column_is_one_line(refused, tmp_path, column, value, says):
    csv = tmp_path / "text.csv"
    rows = paper()
    rows.loc[20, column] = value
    rows.to_csv(csv, index=False)
    assert refused(csv).startswith(f"analysis: {csv} line 22: {says}")


def test_rows_no_seed_tells_apart_are_one_line(refused, tmp_path):
    csv = tmp_path / "no_seed.csv"
    paper().drop(columns="seed").to_csv(csv, index=False)
    assert refused(csv) == (
        f"analysis: {csv} lines 18 and 19: one configuration at one step (stage 2, model cart, variant base, "
        "d_model 256, n_prelude 6, n_loops 6, step 30500) twice, and no seed to tell the rows apart: add a seed column"
    )


def test_one_run_twice_with_different_values_is_one_line(refused, tmp_path):
    csv = tmp_path / "twice.csv"
    rows = paper()
    pd.concat([rows, rows.loc[[20]].assign(ppl_edu="40.9")]).to_csv(csv, index=False)
    assert refused(csv) == (
        f"analysis: {csv} lines 22 and 54: one run (stage 2, model cart, variant base, d_model 256, n_prelude 6, "
        "n_loops 8, seed 137, step 30500) twice, with different ppl_edu ('40.77' and '40.9'); two runs need a column "
        "that tells them apart"
    )


def test_a_benchmark_at_two_shot_counts_is_two_runs(tmp_path):
    """Before, a CSV's 0-shot and 5-shot rows of one model were one run: the 0-shot row was dropped without a word."""
    csv = tmp_path / "shots.csv"
    common = "benchmarks,cart,48,2,4,4,1,100,20.5"
    csv.write_text(
        f"stage,model,d_model,n_prelude,n_loops,eval_n_loops,seed,step,ppl_wiki,num_fewshot\n{common},0\n{common},5\n"
    )
    assert load_csv(csv).final()["num_fewshot"].tolist() == [0, 5]


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_rows_that_measure_nothing_are_listed_and_the_rest_tabled(tmp_path, capsys):
    """Before, ppl 0 and -5 were tabled and won; inf and an accuracy of 1.5 were tabled too; a row without the
    ranking metric and a copy of a row counted silently. A value that measures nothing is blanked (its row's
    other values still count); a row without a valid ranking metric is left out of the tables."""
    csv = tmp_path / "odd.csv"
    rows = paper().assign(bench_cart_lastword_acc="0.5")
    rows.loc[0, "ppl_wiki"] = "inf"  # stage 1, d=256, R=2
    rows.loc[2, "ppl_wiki"] = "0"  # stage 1, d=256, R=6: Stage 1's pick at d=256
    rows.loc[19, "ppl_wiki"] = "-5"  # stage 2, d=256, R=8, seed 42
    rows.loc[28, "bench_cart_lastword_acc"] = "1.5"  # stage 2, d=512, R=8, seed 42
    rows.loc[46, "ppl_wiki"] = ""  # stage 2, d=1024, R=8, seed 42
    pd.concat([rows, rows.loc[[40]]]).to_csv(csv, index=False)  # line 54: a copy of line 42
    out = tmp_path / "out"
    assert main(["--from-csv", str(csv), "--out", str(out)]) == 0
    listed = [
        "left out odd.csv line 2: ppl_wiki=inf is not a finite number",
        "left out odd.csv line 4: ppl_wiki=0 is outside the perplexity range (1, inf)",
        "left out odd.csv line 21: ppl_wiki=-5 is outside the perplexity range (1, inf)",
        "left out odd.csv line 30: bench_cart_lastword_acc=1.5 is outside the accuracy range [0, 1]",
        "left out odd.csv line 54: a duplicate of line 42",
        "left out odd.csv line 48: no ppl_wiki, the ranking metric",
    ]
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if line.startswith("left out")] == listed
    assert "\n## Left out\n\n" + "\n".join(f"- {line}" for line in listed) in (out / "report.md").read_text()
    found = json.loads((out / "findings.json").read_text())
    assert found["input"]["not_completed"] == {"not finite": 1, "out of range": 3, "no ppl_wiki": 1}
    assert [f"left out {o['where']}: {o['reason']}" for o in found["input"]["left_out"]] == listed
    assert found["input"]["runs"] == 52 - 4  # line 30's ppl_wiki still counts: only its accuracy is blanked
    assert found["stage1"]["best_per_width"]["256"]["R"] == 4  # R=6's ppl 0 was the "best"
    seeds = pd.read_csv(out / "stage2_seeds.csv").set_index(["d", "R"])["seeds"]
    assert seeds[256, 8] == seeds[1024, 8] == 2 and seeds[512, 8] == seeds[768, 10] == 3
    grid = pd.read_csv(out / "stage1_grid.csv").set_index("d")
    assert grid.isna().sum().sum() == 2 and grid.loc[256, ["R=2", "R=6"]].isna().all()


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_run_without_the_ranking_metric_is_listed_before_any_table(tmp_path, capsys):
    """Before, a summary without the ranking metric ended in a TypeError after half the tables were written."""
    root = tmp_path / "runs"
    for d in (32, 48):
        for p in (1, 2):
            for r in (2, 4):
                write_run(root, "1", d=d, p=p, r=r)
    gone = root / "1" / "d32-P2-R2-s1" / "summary.json"
    gone.write_text(json.dumps({k: v for k, v in json.loads(gone.read_text()).items() if k != "ppl_austen"}))
    low = root / "1" / "d48-P1-R4-s1" / "summary.json"
    low.write_text(json.dumps({**json.loads(low.read_text()), "ppl_austen": 0.9}))
    out = tmp_path / "out"
    assert main(["--runs", str(root), "--out", str(out)]) == 0
    listed = [  # the run set lists a run folder's impossible value under its stage's line; the analysis, the gap
        "left out 1/d48-P1-R4-s1: ppl_austen=0.9 is outside the perplexity range (1, inf)",
        "left out 1/d32-P2-R2-s1: no ppl_austen, the ranking metric",
    ]
    printed = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert [line for line in printed if line.startswith("left out")] == listed
    found = json.loads((out / "findings.json").read_text())
    assert found["input"]["not_completed"] == {"no ppl_austen": 1, "out of range": 1}
    assert all(line in (out / "report.md").read_text() for line in listed)
    grid = pd.read_csv(out / "stage1_grid.csv").set_index(["d", "P"])
    assert grid.isna().sum().sum() == 2 and pd.isna(grid.loc[(32, 2), "R=2"]) and pd.isna(grid.loc[(48, 1), "R=4"])


def test_stale_files_go_and_the_users_stay(tmp_path, capsys):
    """--only rewrites what it builds and keeps what an earlier analysis wrote; a whole analysis removes a file an
    earlier one wrote and it does not; a file the analysis never wrote is kept by both."""
    out = tmp_path / "out"
    assert main(["--from-csv", str(PAPER), "--out", str(out), "--only", "stage1_grid", "stage1_best"]) == 0
    (out / "lm_eval").mkdir()
    (out / "lm_eval" / "results.json").write_text("{}")
    (out / "notes.md").write_text("mine")
    grid = (out / "stage1_grid.csv").read_bytes()
    (out / "stage1_best.csv").write_text("stale")
    assert main(["--from-csv", str(PAPER), "--out", str(out), "--only", "stage1_best"]) == 0
    tables = [f"stage1_{t}.{ext}" for t in ("best", "grid") for ext in ("csv", "md", "tex")]
    written = sorted(["findings.json", "report.md", *tables])
    assert (out / ".analysis-files").read_text().splitlines() == written
    assert sorted(p.name for p in out.iterdir()) == sorted([*written, ".analysis-files", "lm_eval", "notes.md"])
    assert (out / "stage1_grid.csv").read_bytes() == grid and (out / "stage1_best.csv").read_text() != "stale"
    assert (out / "lm_eval" / "results.json").read_text() == "{}" and (out / "notes.md").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert f"wrote {out / 'report.md'}" in capsys.readouterr().out
    stage2 = tmp_path / "stage2.csv"  # a whole analysis of another input: none of stage 1's tables
    pd.read_csv(PAPER).query("stage == 2").to_csv(stage2, index=False)
    assert main(["--from-csv", str(stage2), "--out", str(out)]) == 0
    assert not any(out.glob("stage1_*")) and (out / "notes.md").read_text() == "mine"
    assert set((out / ".analysis-files").read_text().splitlines()) == {p.name for p in out.iterdir()} - {
        ".analysis-files",
        "lm_eval",
        "notes.md",
    }


def test_a_full_disk_leaves_the_previous_analysis(tmp_path, capsys):
    with small_disk(tmp_path / "small", "2m") as small:
        out = small / "out"
        assert main(["--from-csv", str(PAPER), "--out", str(out), "--only", "stage1_best"]) == 0
        before = contents(out)
        for room in (220_000, 0):  # full part way (matplotlib's PDF writer then fails with an AttributeError), at once
            free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
            (small / f"filler{room}").write_bytes(bytes(free - room))
            capsys.readouterr()
            assert main(["--from-csv", str(PAPER), "--out", str(out)]) == 2
            assert "No space left on device" in one_line(capsys)
            assert contents(out) == before
        assert sorted(p.name for p in small.iterdir()) == ["filler0", "filler220000", "out"]


def test_a_read_only_out_leaves_the_previous_analysis(tmp_path, capsys):
    mounted = tmp_path / "ro"
    out = mounted / "out"
    assert main(["--from-csv", str(PAPER), "--out", str(out), "--only", "stage1_best"]) == 0
    before = contents(out)
    with read_only(mounted):
        capsys.readouterr()
        assert main(["--from-csv", str(PAPER), "--out", str(out)]) == 2
        assert one_line(capsys) == f"analysis: cannot write the analysis to {out}: {mounted} is read-only or not yours"
        assert contents(out) == before


@pytest.mark.slow  # kill -9 of real analyses (~11 s): the full tier
def test_an_analysis_killed_at_any_point_leaves_a_whole_one(tmp_path):
    """Killed (kill -9) while building, OUT holds the old analysis; killed after the swap, the new one; the next
    run settles what was left beside OUT and gives back the user's file."""
    out, mark = tmp_path / "out", tmp_path / "mark"
    command = [sys.executable, "-m", "cart_sweeps.analysis", "--from-csv", str(PAPER), "--out", str(out), "--only"]
    assert subprocess.run([*command, "stage1_best"], cwd=ROOT, capture_output=True).returncode == 0
    (out / "notes.md").write_text("mine")
    old = contents(out)
    for point in ("build", "swap"):
        mark.unlink(missing_ok=True)
        env = with_fault(tmp_path, f"{point}:pause", mark)
        killed = subprocess.Popen([*command, "stage1_grid"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        wait_for(lambda: mark.exists() and mark.read_text().strip(), 120, f"the analysis to reach {point}")
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        assert (tmp_path / ".out.analysis-new").is_dir()
        if point == "build":
            assert contents(out) == old
        else:  # the new analysis whole; the user's file still beside it
            assert set(contents(out)) == {".analysis-files", *(out / ".analysis-files").read_text().split()}
            assert "stage1_grid.csv" in contents(out)
    assert subprocess.run([*command, "stage1_grid"], cwd=ROOT, capture_output=True).returncode == 0
    assert (out / "notes.md").read_text() == "mine"
    assert (out / "stage1_best.csv").read_bytes() == old["stage1_best.csv"]  # --only kept what it did not build
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mark", "out"]
