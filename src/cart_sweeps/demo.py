"""`python -m cart_sweeps.demo [--quick]`: the whole study at the tiny scale, through the real commands.

Each step is the command a researcher would type (printed before it runs); every stage keeps a ledger, so a
second demo skips what is done. `--quick` narrows each stage by its stage file's `quick:` overrides (CI).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cart_sweeps.options import StageRole
from cart_sweeps.record.runfolder import SUMMARY
from cart_sweeps.roles import stage_of, stage_roles

STAGE = ["-m", "cart_sweeps", "-m", "scale=tiny", "launcher.slots=2"]
# Seeds where the decisions need them (docs/statistics.md): the screen re-runs each width's best two with 2 more
SEEDS = {StageRole.screen: ["stage.replicates=2"]}
# The model the paper evaluates at other R: Stage 2's widest, R=6, seed 42 (paper numbers).
VARIABLE_R_SOURCE = {"model.d_model": 1024, "model.n_loops": 6, "seed": 42}
SOURCE = "stage.source=runs/2/d96-P6-R6-s42-<id>"  # shown; the demo fills in the folder variable_r_source finds


def variable_r_source(runs: Path, quick: bool) -> Path:
    """The folder of that Stage-2 run, found by its grid point (the stage's own expansion names folders)."""
    from cart_sweeps.sweep.expand import Stage

    confirm = Stage([f"stage={stage_of(StageRole.confirm)}", *stage_args(StageRole.confirm, quick)])
    run = next((r for r in confirm.runs if VARIABLE_R_SOURCE.items() <= r.params.items()), None)
    if run is None or not (run.run_dir / SUMMARY).exists():
        sys.exit(f"demo: Stage 2 has no run at {VARIABLE_R_SOURCE} to evaluate; run the Stage 2 step first")
    return run.run_dir


def stage_args(role: StageRole, quick: bool) -> list[str]:
    """The overrides after `stage=<name>`: the tiny scale, and --quick's narrowing (the stage file's `quick:`)."""
    return [*STAGE[3:], *(stage_roles()[role].quick() if quick else SEEDS.get(role, []))]


def steps(runs: Path, out: Path, quick: bool) -> list[tuple[str, list[str]]]:
    """(title, command) in order; variable-R's SOURCE is filled in when Stage 2 has run."""

    def stage(role: StageRole) -> list[str]:
        return [*STAGE, f"stage={stage_of(role)}", *stage_args(role, quick)[len(STAGE) - 3 :]]

    return [
        ("Prepare the embedded corpus (tokenizer, bins)", ["-m", "cart_sweeps.data.prepare", "data=embedded"]),
        ("Stage 1: width x R x P screen, 1 seed", stage(StageRole.screen)),
        ("Stage 2: P=6, width x R x 3 seeds, the longer recipe", stage(StageRole.confirm)),
        ("Parity: CART against dense at stored and effective parameter parity", stage(StageRole.parity)),
        ("Ablations: the seven switches and the baseline", stage(StageRole.ablations)),
        ("Variable-R inference of Stage 2's widest R=6 model", [*stage(StageRole.variable_r), SOURCE]),
        ("Benchmarks (lm-eval): each width's best Stage-2 run, 0- and 5-shot", stage(StageRole.benchmarks)),
        ("Analysis: tables, figures, findings", ["-m", "cart_sweeps.analysis", "--runs", str(runs), "--out", str(out)]),
    ]


def decision_table(findings: Path) -> str:
    """The findings' decisions as one Markdown table: what each claim chose, whether it is decided, and why."""
    lines = ["| claim | stage | where | choice | decided | p | why |", "| --- | --- | --- | --- | --- | ---: | --- |"]
    for d in json.loads(findings.read_text()).get("decisions", []):
        where = " ".join(f"{k}={v}" for k, v in d["cell"].items())
        p = "-" if d["p_value"] is None else f"{d['p_value']:.2g}"
        yes = "yes" if d["decided"] else "no"
        choice = "-" if d["choice"] is None else d["choice"]  # an undecided verdict has none (its `leaning`)
        lines.append(f"| {d['claim']} | {d['stage']} | {where} | {choice} | {yes} | {p} | {d['why']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cart_sweeps.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few runs per stage (CI), same commands")
    parser.add_argument("--out", default="analysis/out", help="where the analysis writes (default analysis/out)")
    args = parser.parse_args(argv)
    runs = Path(os.environ.get("CART_SWEEPS_RUNS", "runs"))
    start = time.perf_counter()
    for title, command in steps(runs, Path(args.out), args.quick):
        command = [f"stage.source={variable_r_source(runs, args.quick)}" if a == SOURCE else a for a in command]
        shown = "python " + " ".join(command)
        print(f"\n=== {title}\n$ {shown}", flush=True)
        t0 = time.perf_counter()
        if subprocess.run([sys.executable, *command]).returncode != 0:
            sys.exit(f"demo: this step failed: {shown}")
        print(f"--- {time.perf_counter() - t0:.0f} s", flush=True)
    for table in ("stage1_best", "stage2_seeds", "reversal", "variable_r_bench", "benchmarks"):
        path = Path(args.out) / f"{table}.md"
        if path.exists():
            print(f"\n{path}:\n{path.read_text()}")
    if (findings := Path(args.out) / "findings.json").exists():
        print(f"\nHow sure each finding is ({findings}, docs/statistics.md):\n{decision_table(findings)}")
    print(f"demo finished in {time.perf_counter() - start:.0f} s: runs in {runs}/, tables and figures in {args.out}/")


if __name__ == "__main__":
    main()
