"""Every command in the README's code blocks is exercised here or by the demo, so none can rot.

Commands that launch a stage are expanded and validated with `plan` (same arguments, nothing launched);
commands that train or time are run with a few steps appended; the rest run as written. Those that read trained
runs run against the quick demo's, the others in an empty runs folder. `make` and the SLURM cluster script are
run by CI (.ci/run) itself.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cart_sweeps.config import REPO_ROOT
from cart_sweeps.demo import steps

README = REPO_ROOT / "README.md"
DOCS = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]  # the README and the reference pages it links to
WALK = "## Your own study, step by step"  # its commands run in a folder of its own: tests/test_walkthrough.py


def docs_text() -> str:
    """The README (less its walk's section) and docs/, one text."""
    head, _, rest = README.read_text().partition(WALK)
    _, _, tail = rest.partition("\n## ")
    return "\n".join([f"{head}## {tail}", *(path.read_text() for path in DOCS[1:])])


ENTRY_POINTS = [
    "cart_sweeps",
    "cart_sweeps.plan",
    "cart_sweeps.bench",
    "cart_sweeps.dashboard",
    "cart_sweeps.data.prepare",
    "cart_sweeps.analysis",
    "analysis",  # a checkout's other name of it (analysis/alias.py)
]


def readme_commands() -> list[str]:
    """Each line of the bash blocks of the README and docs/, without its trailing comment, in order (once each: the
    quick start and the demo's section show some of the same commands)."""
    blocks = re.findall(r"```bash\n(.*?)```", docs_text(), flags=re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return list(dict.fromkeys(line for line in lines if line))


def python(args: list[str], env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT
    )


@pytest.fixture(scope="module")
def demo_env(quick_demo):
    root, _ = quick_demo
    return root, {**os.environ, "CART_SWEEPS_RUNS": str(root / "runs"), "HF_DATASETS_OFFLINE": "1"}


def source_folder(root: Path) -> str:
    return str(next((root / "runs" / "2").glob("d96-P6-R6-s42-*")))


def test_the_demo_block_is_what_the_demo_runs():
    ran = [shlex.join(["python", *command]) for _, command in steps(Path("runs"), Path("analysis/out"), quick=False)]
    readme = readme_commands()
    start = readme.index(ran[0])
    assert [shlex.join(shlex.split(line)) for line in readme[start : start + len(ran)]] == ran


def test_the_readme_lists_the_registrys_tables():
    """docs/results.md's table list is written from analysis/registry.py; an edit to either without the other fails
    here."""
    from cart_sweeps.analysis.registry import TABLES_DOC, readme_with_tables

    text = TABLES_DOC.read_text()
    stale = "docs/results.md's table list is stale: run python -m cart_sweeps.analysis --readme-tables"
    assert readme_with_tables(text) == text, stale


def runnable(line: str) -> bool:
    return not line.startswith(("make ", "bash tests/slurm/"))  # CI runs these (.ci/run: the cluster script, make)


def reads_runs(line: str) -> bool:
    """Whether a command reads trained runs (a run folder, the runs root; Stage 1's ledger for zoom, Stage 2's for
    the benchmarks' select=best): the demo's."""
    return re.search(r"\bruns\b", line) is not None or any(s in line for s in ("select=zoom", "stage=benchmarks"))


def ran_by_the_demo(line: str) -> bool:
    """Whether the line is the demo's analysis step, which the quick demo itself runs on its runs (test_demo.py)."""
    command = steps(Path("runs"), Path("analysis/out"), quick=False)[-1][1]
    return shlex.split(line) == ["python", *command]


ON_DEMO = [line for line in readme_commands() if runnable(line) and reads_runs(line) and not ran_by_the_demo(line)]
ON_EMPTY = [line for line in readme_commands() if runnable(line) and not reads_runs(line)]


def test_every_readme_command_runs(demo_env, tmp_path):
    """The commands that read trained runs, against the quick demo's; the rest run in a test of their own below,
    in an empty runs folder, so they need not wait for the demo's worker."""
    root, env = demo_env
    for line in ON_DEMO:
        run_readme_command(line, env, root, tmp_path)
    assert len(ON_DEMO) >= 4 and len(ON_DEMO) + len(ON_EMPTY) >= 15
    assert any(ran_by_the_demo(line) for line in readme_commands())


@pytest.mark.slow  # a subprocess each (a few steps for the ones that train)
@pytest.mark.parametrize("line", ON_EMPTY)
def test_a_readme_command_that_reads_no_runs_runs(line, data_cache, tmp_path):
    env = {**os.environ, "CART_SWEEPS_RUNS": str(tmp_path / "runs"), "HF_DATASETS_OFFLINE": "1"}
    run_readme_command(line, env, tmp_path, tmp_path)


def run_readme_command(line: str, env: dict, root: Path, tmp_path: Path) -> None:
    line = re.sub(r"runs/2/d\w+-P6-R6-s42-<id>", lambda _: source_folder(root), line)  # the trained run to evaluate
    args = shlex.split(line)
    if args[0] == "optuna-dashboard":
        check_optuna_dashboard(args, root)
    else:
        assert args[:2] == ["python", "-m"], line
        check_python(args[1:], env, root, tmp_path)


def check_python(args: list[str], env: dict, root: Path, tmp_path: Path) -> None:
    module, rest = args[1], args[2:]
    rest = [a.replace("runs/", f"{root}/runs/") if a.startswith("runs/") else a for a in rest]
    flags = [a for a in rest if a.startswith("-") and a != "-m"]
    if module == "cart_sweeps" and flags:  # Hydra's flags (--cfg, -sc): as written, they launch nothing
        done = python(["-m", module, *rest], env)
    elif module == "cart_sweeps" and any(a.startswith("stage=") for a in rest):  # a stage: expand, validate
        if "stage.select=zoom" in rest:  # zoom reads Stage 1's ledger: the quick demo's, at the widths it ran
            rest += ["scale=tiny", "model.d_model=256,1024"]
        if "scale=tiny" not in rest and any(a.startswith("stage.source=") for a in rest):
            rest += ["sweep.metric=ppl_austen"]  # a paper run's evaluation, of the demo's tiny run: no wiki set
        done = python(["-m", "cart_sweeps.plan", *(a for a in rest if a != "-m"), "plan.format=csv"], env)
    elif module == "cart_sweeps":  # one run: a few steps
        steps = ["trainer.steps=2", "trainer.warmup_steps=1"]
        done = python(["-m", "cart_sweeps", *rest, *steps, f"hydra.run.dir={tmp_path / 'one'}"], env)
    elif module == "cart_sweeps.bench":
        done = python(["-m", module, *rest, "scale=tiny", "bench.warmup=0", "bench.steps=1"], env)
        assert json.loads(done.stdout)["d_model"] == 1024
    elif module == "cart_sweeps.data.prepare" and "data=paper_mix" in rest:  # offline here: one clear line
        done = python(["-m", module, *rest], env)
        assert done.returncode == 2 and "data=embedded" in done.stderr and len(done.stderr.splitlines()) == 1
        return
    elif module == "cart_sweeps.analysis":
        out = tmp_path / "analysis"
        rest = [str(root / "runs") if a == "runs" else str(out) if a == "analysis/out" else a for a in rest]
        done = python(["-m", module, *rest, "--out", str(out)] if "--out" not in rest else ["-m", module, *rest], env)
    else:
        done = python(["-m", module, *rest], env)
    assert done.returncode == 0, f"python -m {module} {' '.join(rest)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


def check_optuna_dashboard(args: list[str], root: Path) -> None:
    """Serve the demo's ledger on a free loopback port and read its studies back over HTTP."""
    storage = args[1].replace("sqlite:///runs/", f"sqlite:///{root}/runs/")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "optuna-dashboard"), storage, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as reply:
                    studies = json.loads(reply.read())
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, "optuna-dashboard did not answer"
                time.sleep(0.5)
        assert [s["study_name"] for s in studies["study_summaries"]] == ["1"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_python_example_runs():
    """The README's Python API example, run as written from the repo root."""
    blocks = re.findall(r"```python\n(.*?)```", docs_text(), flags=re.S)
    assert len(blocks) == 1
    done = python(["-c", blocks[0]], dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "1024    20.304" in done.stdout  # the paper's best d=1024 Stage-2 PPL_wiki, from the fixture


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_has_help(module):
    done = python(["-m", module, "--help"], dict(os.environ), timeout=120)
    assert done.returncode == 0
    assert "usage" in done.stdout.lower() or "Powered by Hydra" in done.stdout
