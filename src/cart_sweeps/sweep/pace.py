"""This machine's pace, to say how long a stage takes here: a stage's start, each run's fixed costs (its launch,
data, evaluation, checkpoint) and its FLOPs at the rate runs reach here.

Calibrated from the runs this machine finished (their ledger's launch and end times, their summaries' tokens/s);
what they cannot tell (a stage's start; everything before a run has finished here) comes from a short benchmark
(`python -m cart_sweeps.bench_pace`, a few seconds) measured once per machine and cached, so that two calls agree.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

from omegaconf import DictConfig
from optuna.trial import TrialState
from sqlalchemy import create_engine, select
from sqlalchemy.exc import SQLAlchemyError

from cart_sweeps.adapters.optuna import optuna_tables
from cart_sweeps.config import ModelConfig
from cart_sweeps.data.manifest import MANIFEST
from cart_sweeps.data.recipe import LOCAL_BUILDERS, as_config, recipe_dir, recipe_hash
from cart_sweeps.hardware import machine_name
from cart_sweeps.model import train_flops_per_token
from cart_sweeps.stagerecord.ledger import LEDGER_FILES
from cart_sweeps.status import RunStatus

CALIBRATION_RUNS = 64  # the most recent runs finished here that calibrate the pace
PREPARE_S = 60.0  # preparing the embedded corpus, as measured on 2 busy cores, where no recipe was prepared here
FORWARD_SHARE = 1 / 3  # an evaluated token costs the forward pass of a trained one (2 of its 6 FLOPs per parameter)


@dataclass(frozen=True)
class Benchmark:
    """What a short benchmark measured on this machine, cached by `machine_name()`."""

    machine: str
    driver_start_s: float  # `python -m cart_sweeps` to its imports done
    worker_start_s: float  # a run's process to torch and the run code imported
    compose_s: float  # composing a config (a run's is composed by the driver before it launches)
    run_setup_s: float  # building a run's model and optimizer
    checkpoint_s: float  # saving that state
    flops_per_s: float  # one training process on one thread
    load: float  # the 1-minute load average when measured: the rate is what this load allowed
    measured: str


def benchmark_path() -> Path:
    """Where this machine's benchmark is kept: the user's own cache ($XDG_CACHE_HOME or ~/.cache), not
    $CART_SWEEPS_CACHE, which may be shared (a cluster's data) or new (a test session's), named by the machine."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "cart_sweeps" / "machine" / f"{_slug(machine_name())}.json"


def cached_benchmark() -> Benchmark:
    """This machine's benchmark: read from the cache, else measured now (once) and cached."""
    path = benchmark_path()
    if path.is_file():
        try:
            return Benchmark(**json.loads(path.read_text()))
        except (TypeError, ValueError):
            pass  # another version's record: measured again
    bench = measure_benchmark()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(asdict(bench), indent=2) + "\n")
    os.replace(tmp, path)
    return bench


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


class BenchmarkFailed(Exception):
    """This machine's benchmark did not run (its command's last line of error says why)."""


def _timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise BenchmarkFailed(f"this machine's benchmark (`{' '.join(command[1:])}`) failed: {why}")
    return time.perf_counter() - start, done.stdout


def measure_benchmark() -> Benchmark:
    """Time the driver's imports, and a tiny run's phases in a process of its own (`python -m
    cart_sweeps.bench_pace`): what that process spent besides them is a worker's start."""
    driver_s, _ = _timed([sys.executable, "-c", "import cart_sweeps.sweep.driver"])
    total_s, out = _timed([sys.executable, "-m", "cart_sweeps.bench_pace"])
    b = json.loads(out.splitlines()[-1])
    own = b["compose_s"] + b["setup_s"] + b["warmup_s"] + b["steps_s"] + b["checkpoint_s"]
    return Benchmark(
        machine=machine_name(),
        driver_start_s=driver_s,
        worker_start_s=total_s - own,
        compose_s=b["compose_s"],
        run_setup_s=b["setup_s"],
        checkpoint_s=b["checkpoint_s"],
        flops_per_s=b["flops_per_s"],
        load=os.getloadavg()[0],
        measured=datetime.now().isoformat(timespec="seconds"),
    )


@dataclass(frozen=True)
class Finished:
    """A run this machine finished: the time its slot held it, and what it did in that time."""

    slot_s: float
    train_s: float
    flops_per_s: float
    eval_flops: float

    @property
    def fixed_s(self) -> float:
        """Its slot's time besides training and evaluating: launch, setup, data, checkpoint, the driver's poll."""
        return self.slot_s - self.train_s - self.eval_flops / self.flops_per_s


def finished_here(runs_root: Path, host: str | None = None) -> list[Finished]:
    """The most recent runs (at most CALIBRATION_RUNS) that completed on this host under `runs_root`, from each
    stage's SQLite ledger (launch and end) and each run's summary (tokens/s, shape, host)."""
    host = host or socket.gethostname()
    rows: list[tuple[str, str, str]] = []
    for ledger in runs_root.glob(f"*/{LEDGER_FILES['sqlite']}"):
        rows += _completed_trials(ledger)
    rows.sort(reverse=True)  # the latest end first
    out: list[Finished] = []
    for complete, start, run_dir in rows:
        if len(out) == CALIBRATION_RUNS:
            break
        if (run := _finished(Path(run_dir), start, complete, host)) is not None:
            out.append(run)
    return out


def _completed_trials(ledger: Path) -> list[tuple[str, str, str]]:
    """(end, launch, run folder) of each completed trial of an Optuna SQLite ledger, read-only, through the tables
    the ledger reads (adapters/optuna.py)."""
    trials, attrs = optuna_tables.TrialModel.__table__, optuna_tables.TrialUserAttributeModel.__table__
    query = (
        select(trials.c.datetime_complete, trials.c.datetime_start, attrs.c.value_json)
        .join(attrs, (attrs.c.trial_id == trials.c.trial_id) & (attrs.c.key == "run_dir"))
        .where(trials.c.state == TrialState.COMPLETE)
        .order_by(trials.c.datetime_complete.desc())
        .limit(CALIBRATION_RUNS)
    )
    engine = create_engine(f"sqlite:///file:{ledger}?mode=ro&uri=true")
    try:
        with engine.connect() as db:
            rows = db.execute(query).all()
    except (SQLAlchemyError, ValueError):
        return []  # not a ledger (yet), or one another version wrote: it calibrates nothing
    finally:
        engine.dispose()
    return [(str(end), str(start), json.loads(folder)) for end, start, folder in rows if end and start]


def _finished(run_dir: Path, start: str, complete: str, host: str) -> Finished | None:
    try:
        s = json.loads((run_dir / "summary.json").read_text())
        if s.get("status") != RunStatus.COMPLETED or (s.get("env") or {}).get("host") != host:
            return None
        t, tokens_per_s = s["trainer"], s["tokens_per_s"]
        per_token = train_flops_per_token(ModelConfig(**s["model"]), t["seq_len"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not tokens_per_s:
        return None
    slot_s = (datetime.fromisoformat(complete) - datetime.fromisoformat(start)).total_seconds()
    train_s = s["step"] * t["micro_batch_size"] * t["grad_accum"] * t["seq_len"] / tokens_per_s
    if train_s > slot_s:  # resumed: its slot held only part of it
        return None
    sets = sum(1 for k in s if k.startswith("ce_"))
    flops_per_s = tokens_per_s * per_token
    return Finished(slot_s, train_s, flops_per_s, eval_tokens(t, s["step"], sets) * per_token * FORWARD_SHARE)


def eval_tokens(trainer: Any, steps: int, sets: int) -> int:
    """Tokens a run evaluates: its validation windows of each set, at each evaluation (every eval_every, and the
    last step)."""
    evals = math.ceil(steps / trainer["eval_every"]) if steps else 0
    return evals * trainer["eval_windows"] * trainer["seq_len"] * sets


@dataclass(frozen=True)
class Pace:
    """How long things take here: a stage's start, a run's fixed cost, a run's FLOP/s; `basis` says from what."""

    stage_start_s: float
    run_fixed_s: float
    flops_per_s: float
    basis: str

    @classmethod
    def here(cls, runs_root: Path, slots: int) -> Pace:
        """From the runs finished here where there are any (each run's fixed cost and rate, as they ran), else
        from the benchmark (one process alone: its rate shared where `slots` runs outnumber the cores)."""
        bench = cached_benchmark()
        start = bench.driver_start_s + bench.compose_s + bench.worker_start_s
        if finished := finished_here(runs_root):
            return cls(
                start,
                median(max(0.0, f.fixed_s) for f in finished),
                median(f.flops_per_s for f in finished),
                f"{len(finished)} runs finished here",
            )
        share = min(1.0, (os.cpu_count() or 1) / slots)
        fixed = bench.compose_s + bench.run_setup_s + bench.checkpoint_s
        return cls(start, fixed, bench.flops_per_s * share, f"a benchmark of this machine ({bench.measured})")

    def run_seconds(self, train_flops: float, eval_flops: float, flops_per_s: float | None = None) -> float:
        """A run's time in its slot: its fixed cost, and its training and evaluation FLOPs at `flops_per_s` (the
        rate measured on finished runs of its shape, where there are any) or this machine's."""
        return self.run_fixed_s + (train_flops + eval_flops) / (flops_per_s or self.flops_per_s)


def run_eval_flops(cfg: DictConfig) -> float:
    """A run's evaluation FLOPs: its validation tokens at the forward share of its training FLOPs per token."""
    t = cfg.trainer
    per_token = train_flops_per_token(cfg.model, t.seq_len)
    return eval_tokens(t, t.steps, len(cfg.data.validation)) * per_token * FORWARD_SHARE


def prepare_seconds(data: DictConfig) -> float | None:
    """None where the recipe is prepared or reads the hub; else the time its driver spends preparing it before
    the first run (sweep/dataprep.py): as long as the recipes prepared in the same cache took (their manifests'
    build time), else PREPARE_S."""
    cfg = as_config(data)
    folder = recipe_dir(cfg, recipe_hash(cfg))
    if folder.exists() or any(s.path not in LOCAL_BUILDERS for s in [*cfg.sources, *cfg.validation]):
        return None  # prepared; or the hub's, which is prepared before launch (sweep/preflight.py), not by a run
    built = []
    for manifest in folder.parent.glob(f"*/{MANIFEST}"):
        try:
            built.append(float(json.loads(manifest.read_text())["build_seconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return median(built) if built else PREPARE_S
