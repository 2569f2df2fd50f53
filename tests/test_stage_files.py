"""A stage file is read only when a command reads that stage, and read safely: a broken or hostile file in a
--config-dir (a YAML mistake, a "billion laughs" alias bomb, a FIFO, bytes that are no UTF-8) is one line naming
it when it is asked for, and never stops a command of another stage there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stages import env

from cart_sweeps import stagefile
from cart_sweeps.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
GOOD = "name: mine\ngrid:\n  model.n_loops: [1, 2]\n"


def bomb(levels: int = 9) -> str:
    """The "billion laughs": nine lists of nine aliases to the list before, 9**9 strings once expanded."""
    lines = ["name: bomb", 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


BROKEN: dict[str, bytes | None] = {  # file name -> its bytes (None: a FIFO)
    "syntax": b"name: syntax\ngrid: {model.n_loops: [1,\n  b: : :\n",
    "bomb": bomb().encode(),
    "fifo": None,
    "latin1": "name: latin1\n# caf\xe9\n".encode("latin-1"),
}
SAYS = {
    "syntax": r"line 3, column 6: did not find expected node content \(while parsing a flow node\); fix the YAML there",
    "bomb": r"line \d+, column \d+: its aliases expand to over 100,000 values; write the values out",
    "fifo": r"not a regular file \(a FIFO, device or folder\); a stage file is a plain \.yaml file",
    "latin1": r"line 2, column 6: byte 0xe9 is not UTF-8 text; save it as UTF-8",
}


def write(folder: Path, name: str, data: bytes | None) -> Path:
    path = folder / f"{name}.yaml"
    if data is None:
        os.mkfifo(path)
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", list(BROKEN))
def test_the_loader_refuses_a_broken_file_in_one_line_at_once(tmp_path, name):
    path = write(tmp_path, name, BROKEN[name])
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        stagefile.check(path)
    assert time.perf_counter() - start < 1.0
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{path}: ") and re.fullmatch(f"{path}: {SAYS[name]}", line), line


def test_the_loader_refuses_a_file_past_its_size_and_an_alias_inside_itself(tmp_path):
    big = write(tmp_path, "big", b"name: big\n" + b"# padding\n" * (stagefile.MAX_BYTES // 10))
    with pytest.raises(ConfigError, match="over 256 KB; a stage file is a page of settings"):
        stagefile.check(big)
    loop = write(tmp_path, "loop", b"name: loop\ngrid: &g\n  x: *g\n")
    with pytest.raises(ConfigError, match=r"line 2, column 7: an alias inside its own anchor"):
        stagefile.check(loop)
    lists = write(tmp_path, "lists", b"name: lists\nmapped: 1\n- a\n")
    with pytest.raises(ConfigError, match=r"lists\.yaml: line 3, column 1: .*; fix the YAML there"):
        stagefile.check(lists)


def test_a_few_aliases_load_as_written_and_the_role_is_read_alone(tmp_path):
    path = write(tmp_path, "mine", b"name: mine\nrole: screen\nseeds: &s [42, 137]\ngrid: {seed: *s}\n")
    assert stagefile.load(path) == {"name": "mine", "role": "screen", "seeds": [42, 137], "grid": {"seed": [42, 137]}}
    assert stagefile.top_level(path, ("name", "role")) == {"name": "mine", "role": "screen"}
    assert stagefile.top_level(write(tmp_path, "empty", b""), ("role",)) == {}


def command(runs: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env(runs), capture_output=True, text=True, cwd=REPO, timeout=120
    )


@pytest.fixture
def folder(tmp_path) -> Path:
    """A config folder holding a good stage `mine` beside every broken file."""
    (tmp_path / "cfg" / "stage").mkdir(parents=True)
    (tmp_path / "cfg" / "stage" / "mine.yaml").write_text(GOOD)
    for name, data in BROKEN.items():
        write(tmp_path / "cfg" / "stage", name, data)
    return tmp_path / "cfg"


@pytest.mark.slow  # a dozen commands (~3 s each on 2 cores)
def test_a_broken_sibling_never_stops_another_stages_command_and_is_one_line_when_asked(folder, tmp_path):
    runs = tmp_path / "runs"
    args = ["--config-dir", str(folder), "scale=tiny", "trainer.steps=4"]
    start = time.perf_counter()
    plan = command(runs, "cart_sweeps.plan", *args, "stage=mine", "plan.format=csv")
    assert plan.returncode == 0 and not re.search("error|warning|Traceback", plan.stderr), plan.stderr[-3000:]
    assert time.perf_counter() - start < 60  # the bomb beside it is never expanded (it took over 90 s)
    assert plan.stdout.count("\n") == 3  # the header and the stage's two runs
    shown = command(runs, "cart_sweeps", *args, "stage=mine", "--cfg", "job")  # the driver's composition
    assert shown.returncode == 0 and "model.n_loops=2" in shown.stdout, shown.stderr[-3000:]
    one = command(runs, "cart_sweeps", *args, "model.n_loops=2", "--cfg", "job")  # the single-run path
    assert one.returncode == 0 and "n_loops: 2" in one.stdout, one.stderr[-3000:]
    for name in BROKEN:
        for module in ("cart_sweeps.plan", "cart_sweeps"):
            done = command(runs, module, *args, f"stage={name}")
            assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
            (line,) = done.stderr.splitlines()
            assert re.fullmatch(f"error: {folder}/stage/{name}.yaml: {SAYS[name]}", line), line
    assert not runs.exists()  # nothing launched


@pytest.mark.slow
def test_a_stage_claiming_a_role_warns_of_a_sibling_it_cannot_read_in_one_line_each(folder, tmp_path):
    (folder / "stage" / "mine.yaml").write_text(GOOD.replace("grid:", "role: mine_table\ngrid:"))
    done = command(tmp_path / "runs", "cart_sweeps.plan", "--config-dir", str(folder), "stage=mine", "scale=tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    warned = sorted(done.stderr.splitlines())
    assert len(warned) == len(BROKEN) and all(w.startswith("warning: ") for w in warned), warned
    assert all(w.endswith("(skipped when finding which stage plays each role)") for w in warned)
