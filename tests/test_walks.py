"""The extension walks of docs/extending.md, each done in a copy of the repository: the edits the page
names, then the real command run against the copy, and the files the walk touched counted against the number
the page states (read from docs/extending.md, so the two cannot drift apart)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TREES = ("src", "conf", "sweeps", "analysis", "tests")
EXTENDING = "docs/extending.md"  # the walks, each with the number of files it touches
SKIP = shutil.ignore_patterns("__pycache__", "out", "*.egg-info", ".pytest_cache")


def stated_count(walk: str) -> int:
    """The file count the bullet `- **<walk>**` of docs/extending.md states ("..., 3 files: ...")."""
    text = (REPO / EXTENDING).read_text()
    bullet = re.search(rf"^- \*\*{re.escape(walk)}\*\*(.*?)(?=^- |^\S|\Z)", text, re.M | re.S)
    assert bullet, f"{EXTENDING} has no extension walk `- **{walk}**`"
    count = re.search(r"(\d+) files?\b", bullet.group(1))
    assert count, f"{EXTENDING}'s walk `{walk}` states no file count"
    return int(count.group(1))


class Copy:
    """A copy of the repository's code and configs, edited as a walk says and run as a user runs it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for tree in TREES:
            shutil.copytree(REPO / tree, root / tree, symlinks=True, ignore=SKIP)
        shutil.copytree(REPO / "docs", root / "docs")
        self.runs = root.parent / "runs"

    def path(self, rel: str) -> Path:
        return self.root / rel

    def write(self, rel: str, text: str) -> None:
        self.path(rel).parent.mkdir(parents=True, exist_ok=True)
        self.path(rel).write_text(text)

    def edit(self, rel: str, old: str, new: str) -> None:
        """Replace `old` (once in the file) by `new`."""
        text = self.path(rel).read_text()
        assert text.count(old) == 1, f"{rel}: the walk's anchor {old!r} is not there once"
        self.path(rel).write_text(text.replace(old, new))

    def touched(self) -> list[str]:
        """The files that differ from the repository's, or are new."""
        out = []
        for tree in TREES:
            for p in sorted((self.root / tree).rglob("*")):
                if p.is_symlink() or not p.is_file() or "__pycache__" in p.parts:
                    continue
                rel = p.relative_to(self.root)
                if not (REPO / rel).is_file() or (REPO / rel).read_bytes() != p.read_bytes():
                    out.append(str(rel))
        return out

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "PYTHONPATH": f"{self.root / 'src'}{os.pathsep}{self.root}",
            "CART_SWEEPS_RUNS": str(self.runs),
        }
        done = subprocess.run(
            [sys.executable, *command], cwd=self.root, env=env, capture_output=True, text=True, timeout=600
        )
        if check:
            assert done.returncode == 0, done.stderr[-3000:]
        return done


def plan_rows(done: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    """`plan plan.format=csv`'s rows (its makespan line after them aside)."""
    return [row for row in csv.DictReader(io.StringIO(done.stdout)) if row["label"] is not None]


@pytest.fixture
def copy(tmp_path: Path) -> Copy:
    return Copy(tmp_path / "repo")


def test_a_stage_with_its_own_axes(copy: Copy) -> None:
    """One stage file: its runs are labelled and planned by the keys it varies, with no code changed."""
    copy.write(
        "sweeps/wd.yaml",
        "name: wd\ngrid:\n  trainer.weight_decay: [0.0, 0.1]\nrecipe:\n  model.d_model: 256\n  trainer.steps: 3000\n",
    )
    assert len(copy.touched()) == stated_count("A stage with its own axes")
    rows = plan_rows(copy.run("-m", "cart_sweeps.plan", "stage=wd", "scale=tiny", "plan.format=csv"))
    assert [r["label"] for r in rows] == ["d32-P2-R4-wd0-s42", "d32-P2-R4-wd0.1-s42"]


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_stage_with_its_own_paper_table(copy: Copy) -> None:
    """The stage file with its role, and its record in analysis/registry.py: the analysis lists its table."""
    copy.write("sweeps/warmup.yaml", "name: warmup\nrole: warmup\ngrid:\n  trainer.warmup_steps: [0, 100]\n")
    copy.edit(
        "analysis/registry.py",
        "TABLES: dict[str, Table] = {\n",
        'TABLES: dict[str, Table] = {\n    "warmup_grid": Table(reads=("warmup",), build=lambda rows, metric: rows),\n',
    )
    assert len(copy.touched()) == stated_count("A stage with its own paper table")
    copy.run("-m", "analysis", "--readme-tables")
    assert "warmup_grid" in copy.path("docs/results.md").read_text()
    rows = plan_rows(copy.run("-m", "cart_sweeps.plan", "stage=warmup", "scale=tiny", "plan.format=csv"))
    assert len(rows) == 2


SERIAL_POOL = '''"""One run at a time on this machine, GPUs or not: docs/extending.md's launcher walk."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING, DictConfig

from cart_sweeps.config import at_least
from cart_sweeps.sweep.pools.local import LocalLauncherConfig, LocalPool


@dataclass
class SerialLauncherConfig(LocalLauncherConfig):
    niceness: int = field(default=MISSING, metadata=at_least(0))


class SerialPool(LocalPool):
    settings = SerialLauncherConfig

    @staticmethod
    def capacity_of(launcher: DictConfig) -> int:
        return 1
'''


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_launcher(copy: Copy) -> None:
    """A pool module with its settings and a launcher file: `plan` costs the stage on its one slot, and a
    setting out of its bounds is one line."""
    copy.write("src/cart_sweeps/sweep/pools/serial.py", SERIAL_POOL)
    local = copy.path("conf/launcher/local.yaml").read_text()
    copy.write(
        "conf/launcher/serial.yaml",
        local.replace("pools.local.LocalPool", "pools.serial.SerialPool") + "niceness: 5\n",
    )
    assert len(copy.touched()) == stated_count("A launcher")
    stage = ["-m", "cart_sweeps.plan", "stage=1", "scale=tiny", "launcher=serial", "launcher.slots=4"]
    assert "on 1 slot" in copy.run(*stage).stdout
    refused = copy.run(*stage, "launcher.niceness=-1", check=False)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: launcher.niceness=-1 must be >= 0"
    ], refused.stderr


BIGRAM = '''"""A bigram baseline: the tied embedding and a final norm, no layers (docs/extending.md's model walk)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from cart_sweeps.model.layers import RMSNorm, init_weights


class Bigram(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        init_weights(self, cfg.init_std)

    def forward(self, tokens: Tensor, n_loops: int | None = None) -> Tensor:
        return self.norm(self.embed(tokens)) @ self.embed.weight.T

    def rho(self) -> None:
        return None

    def no_decay_names(self) -> set[str]:
        return {"norm.weight"}
'''

BIGRAM_SPEC = """    "bigram": ModelSpec(
        cls="cart_sweeps.model.bigram.Bigram",
        shape=(),
        blocks=lambda m: 0,
        counts=lambda m: dict.fromkeys(("stored", "effective"), m.vocab_size * m.d_model + m.d_model) | {"core": 0},
        kind="bigram",
    ),
}
"""

BUILT = """
import json
from cart_sweeps.compose import compose_config
from cart_sweeps.model import build_model, param_counts
cfg = compose_config(["scale=tiny", "model=bigram"])
model = build_model(cfg.model)
print(json.dumps([sum(p.numel() for p in model.parameters()), param_counts(cfg.model)["stored"]]))
"""


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_model(copy: Copy) -> None:
    """Its spec, its module and its file: `plan` labels and counts it, its built parameters are its formula's,
    and a name no spec registers is one line."""
    copy.write("src/cart_sweeps/model/bigram.py", BIGRAM)
    copy.edit("src/cart_sweeps/modelspec.py", "    ),\n}\n", "    ),\n" + BIGRAM_SPEC)
    dense = copy.path("conf/model/dense.yaml").read_text()
    copy.write("conf/model/bigram.yaml", "name: bigram\n" + dense.split("name: dense\n", 1)[1])
    assert len(copy.touched()) == stated_count("A model")
    stored = 4096 * 64 + 64  # the embedded corpus's vocabulary at scale=tiny's width, and the norm
    plan = ["-m", "cart_sweeps.plan", "stage=adhoc", "scale=tiny"]
    (row,) = plan_rows(copy.run(*plan, "model=bigram", "plan.format=csv"))
    assert (row["label"], row["model.n_loops"], row["model.n_layers"], row["params_stored"]) == (
        "bigram-d64-s42", "", "", str(stored)
    )  # fmt: skip
    assert json.loads(copy.run("-c", BUILT).stdout) == [stored, stored]  # built as its formula counts it
    refused = copy.run(*plan, "model.name=bigrm", check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "model.name=bigrm: no such model (known: cart, dense, bigram)" in refused.stderr


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_an_ablation_switch(copy: Copy) -> None:
    """A switch (the final norm left out): `plan` labels its variant and counts its parameters, and the tests
    the README names pass in the copy (the switch built as counted, its default pinned)."""
    copy.edit(
        "src/cart_sweeps/config.py",
        "    disable_lie: bool = field(default=False, metadata=ABLATION)\n",
        "    disable_lie: bool = field(default=False, metadata=ABLATION)\n"
        "    disable_norm: bool = field(default=False, metadata=ABLATION)\n",
    )
    copy.edit(
        "src/cart_sweeps/model/cart.py",
        "self.norm = RMSNorm(d, eps)",
        "self.norm = nn.Identity() if cfg.disable_norm else RMSNorm(d, eps)",
    )
    copy.edit("src/cart_sweeps/modelspec.py", "+ core + d + extras", "+ core + (0 if m.disable_norm else d) + extras")
    copy.edit(
        "sweeps/ablations.yaml",
        "  disable_lie: {model.disable_lie: true}\n",
        "  disable_lie: {model.disable_lie: true}\n  disable_norm: {model.disable_norm: true}\n",
    )
    copy.edit(
        "tests/test_model.py",
        '    {"disable_lie": True},\n',
        '    {"disable_lie": True},\n    {"disable_norm": True},\n',
    )
    copy.edit(
        "tests/test_identity.py",
        "LATER_DEFAULTS: dict[str, dict[str, object]] = {\n",
        'LATER_DEFAULTS: dict[str, dict[str, object]] = {\n    "ModelConfig": {"disable_norm": False},\n',
    )
    assert len(copy.touched()) == stated_count("An ablation switch")
    rows = plan_rows(copy.run("-m", "cart_sweeps.plan", "stage=ablations", "scale=tiny", "plan.format=csv"))
    stored = {r["label"]: int(r["params_stored"]) for r in rows}
    assert stored["d96-P6-R6-disable_norm-s42"] == stored["d96-P6-R6-s42"] - 96  # the final norm's weight
    tests = ["tests/test_model.py", "-k", "boolean or stored_count", "tests/test_identity.py", "-k", "later_fields"]
    copy.run("-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *tests)


@pytest.mark.slow  # trains a run
def test_a_metric(copy: Copy) -> None:
    """A per-set metric (bits per token): its kind and its value; its runs'
    summaries carry it for every validation set, and a stage takes it as its metric (sweep.metric)."""
    copy.edit(
        "src/cart_sweeps/metric.py",
        "KINDS = (\n",
        'KINDS = (\n    Kind("bpt", "bits per token", "bits/token", higher_is_better=False, low=0.0),\n',
    )
    copy.edit(
        "src/cart_sweeps/train/loop.py",
        '"bpb": mean_ce / math.log(2) / bytes_per_token}',
        '"bpb": mean_ce / math.log(2) / bytes_per_token, "bpt": mean_ce / math.log(2)}',
    )
    assert len(copy.touched()) == stated_count("A metric")
    tiny = ["scale=tiny", "model.d_model=32", "trainer.steps=4", "trainer.warmup_steps=0", "trainer.eval_every=4"]
    copy.run("-m", "cart_sweeps", "stage=adhoc", *tiny, "sweep.metric=bpt_austen")
    (summary,) = (json.loads(p.read_text()) for p in copy.runs.glob("*/*/summary.json"))
    assert summary["status"] == "completed"
    for name in ("austen", "bible", "shakespeare"):
        assert summary[f"bpt_{name}"] == pytest.approx(summary[f"ce_{name}"] / 0.6931471805599453)


CONFIRM_RULE = '''"""The grid's best re-run with more seeds (stage.confirm=K): docs/extending.md's stage-kind walk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from cart_sweeps.config import ConfigError
from cart_sweeps.metric import require
from cart_sweeps.rules.axes import SEED
from cart_sweeps.rules.decide import seed_order
from cart_sweeps.rules.rule import WHY, Added, StageRule
from cart_sweeps.stagerecord.runset import stage_runs


class ConfirmRule(StageRule):
    """After a one-seed grid, its best configuration by the sweep metric runs stage.confirm more seeds."""

    def adds(self) -> bool:
        return True

    def check_own(self) -> None:
        if self.stage.spec.confirm < 1 or SEED in self.stage.axes:
            raise ConfigError(f"stage.confirm={self.stage.spec.confirm} re-runs a one-seed grid's best: a count >= 1")

    def earlier(self, history: dict[str, list[FrozenTrial]]) -> list[Added]:
        last = [trials[-1] for trials in history.values() if WHY in trials[-1].user_attrs]
        return [Added(self.stage.run(dict(t.params)), str(t.user_attrs[WHY])) for t in last]

    def next_round(self, ledger: Any, say: Callable[[str], None]) -> list[Added]:
        stage, metric = self.stage, self.stage.base.sweep.metric
        grid = {run.run_id for run in stage.runs}
        used = stage_runs(Path(stage.base.paths.runs), stage.name, scale=stage.base.scale.name).used
        done = [(run.summary.value(metric), run) for run in used if run.summary and run.run_id in grid]
        if len(done) < len(grid) or any(value is None for value, _ in done):
            return []
        value, best = min(done, key=lambda pair: require(metric).sign * pair[0])
        seeds = seed_order([best.summary.details[SEED]])[1 : 1 + stage.spec.confirm]
        why = f"confirm: the grid's best by {metric} ({value:.4g})"
        return [Added(stage.run({**best.params, SEED: s}), f"{why}; seed {s}") for s in seeds]

    def plan_lines(self, hours: dict[str, float]) -> list[str]:
        return [f"stage.confirm={self.stage.spec.confirm}: the grid's best runs {self.stage.spec.confirm} more seeds"]
'''


@pytest.mark.slow  # trains three runs
def test_a_stage_kind(copy: Copy) -> None:
    """A rule module and its option: `plan` says what it adds, a bad value is one line, and a launch trains the
    grid, then the runs its rule adds (the grid's best with the next seed), each with why."""
    copy.write("src/cart_sweeps/rules/confirm.py", CONFIRM_RULE)
    copy.edit(
        "src/cart_sweeps/config.py",
        "    sentinels: int = 0",
        '    confirm: int = field(default=0, metadata=rule("cart_sweeps.rules.confirm.ConfirmRule"))\n'
        "    sentinels: int = 0",
    )
    assert len(copy.touched()) == stated_count("A stage kind")
    tiny = ["scale=tiny", "model.d_model=32", "trainer.steps=4", "trainer.warmup_steps=0", "trainer.eval_every=4"]
    stage = ["stage=adhoc", "model.n_loops=1,2", *tiny]
    planned = copy.run("-m", "cart_sweeps.plan", *stage, "stage.confirm=1")
    assert "stage.confirm=1: the grid's best runs 1 more seeds" in planned.stdout
    refused = copy.run("-m", "cart_sweeps", "-m", *stage, "stage.confirm=-1", check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith("re-runs a one-seed grid's best: a count >= 1")
    launched = copy.run("-m", "cart_sweeps", "-m", *stage, "stage.confirm=1", "launcher.slots=2")
    summaries = [json.loads(p.read_text()) for p in copy.runs.glob("adhoc/*/summary.json")]
    grid = [s for s in summaries if s["seed"] == 42]
    best = min(grid, key=lambda s: s["ppl_austen"])
    (added,) = [s for s in summaries if s["seed"] != 42]
    assert added["seed"] == 137 and added["model"]["n_loops"] == best["model"]["n_loops"]
    assert "confirm: the grid's best by ppl_austen" in launched.stdout
