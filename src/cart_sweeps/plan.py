"""`python -m cart_sweeps.plan stage=<name> [overrides]`: a stage's runs and their cost, without launching.

Runs are expanded exactly as `python -m cart_sweeps -m` would launch them (same ids, same folders) and
listed in the order the driver launches them (longest first); the status column comes from the stage's
ledger when it exists.
"""

from __future__ import annotations

import csv
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from statistics import median
from typing import Any

from filelock import FileLock, Timeout
from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial
from rich.console import Console

from cart_sweeps.compose import run_cli
from cart_sweeps.config import ConfigError
from cart_sweeps.hardware import nvidia_gpus
from cart_sweeps.metric import THROUGHPUT, seed_spreads
from cart_sweeps.modelspec import SHAPE_KEYS, spec_of
from cart_sweeps.naming import LABEL_SHOWS, short_value
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.register import stage_paths
from cart_sweeps.rules.axes import STEPS
from cart_sweeps.stagerecord.ledger import Ledger, LedgerDamaged, merged_attempts, status_of
from cart_sweeps.stagerecord.results import LOCK, Held, Results, standing
from cart_sweeps.stagerecord.runset import stage_runs
from cart_sweeps.stagerecord.standing import Standing
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.cost import Throughput, launch_set, makespan, makespan_bound, run_cost
from cart_sweeps.sweep.expand import Run, Stage
from cart_sweeps.sweep.pace import BenchmarkFailed, Pace, prepare_seconds, run_eval_flops
from cart_sweeps.sweep.pool import capacity, pool_class
from cart_sweeps.sweep.pools.local import LocalPool
from cart_sweeps.sweep.preflight import check_stage_settings, stage_configs
from cart_sweeps.text import count, duration

STAGES = "|".join(p.stem for p in stage_paths())  # the shipped stage files
USAGE = f"""usage: python -m cart_sweeps.plan stage=<name> [overrides]

Lists the runs of a stage without launching any, in the order the driver launches them (longest
first): run id, model, seed, variant, parameters, training tokens and FLOPs, estimated GPU-hours (at the
throughput measured on finished runs of the same width where there are any), and the ledger's status;
then the simulated makespan on the stage's slots beside its lower bound.

  stage=<name>                               the stage (sweeps/<name>.yaml): {STAGES}
  plan.gpu=rtx3090|rtx4090|a100|h100|h200    GPU for the estimate (peak dense bf16 FLOP/s)
  plan.mfu=0.35                              assumed model FLOPs utilisation
  plan.format=table|csv                      output
  plan.slots=8                               slots for the simulated makespan (default: the launcher's)
  scale=tiny, model.d_model=256,512, ...     any override `python -m cart_sweeps stage=<name>` takes
  --config-dir DIR, --config-name NAME       Hydra's: your own stages (DIR/stage/<name>.yaml) and presets
                                             (or hydra.searchpath=[file:///DIR])

Grid values are the paper's numbers (a width at scale=tiny, e.g. 32, is read back as the paper's 256)
unless the stage file says `numbers: own`; the `paper` column shows them where the scale changed them, and
a line below the table maps the recipe. Without plan.gpu, a line also estimates the stage's time on this
machine, where the local launcher runs it: its start, each run's fixed costs beside its FLOPs, calibrated from
the runs finished here, else a benchmark measured once per machine (docs/paper-scale.md).
"""

COLUMNS = [
    "run_id",
    "label",
    "model.name",
    "model.d_model",
    *(f"model.{key}" for key in SHAPE_KEYS),  # each model's shape keys (cart_sweeps.modelspec)
    "seed",
    "variant",
    "paper",
    "params_stored",
    "params_effective",
    "tokens",
    "train_flops",
    "gpu_hours",
    "status",
]


def driver_running(sweep_dir: Path) -> bool:
    """Whether a driver holds the stage's lock (then RUNNING trials are running, not cut off)."""
    lock = FileLock(sweep_dir / LOCK)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def statuses(
    stage: Stage,
    runs: Sequence[Run],
    history: dict[str, list[FrozenTrial]] | None,
    held: Mapping[str, Held | None],
    occupants: Mapping[str, RunSummary],
) -> dict[str, str]:
    """Run id -> status, where each run stands as the driver sorts it (a RunStatus, new, cut off, lost, moved,
    occupied, a result another stage holds: `completed (stage 2)`); without a readable ledger (None), from `held`."""
    driver = history is not None and driver_running(stage.sweep_dir)
    history = history or {}
    shown: dict[Standing, str] = {Standing.NEW: "new", Standing.LOST: "lost"}
    shown[Standing.CUT_OFF] = RunStatus.RUNNING if driver else "cut off"
    out = {}
    for run in runs:
        trials, result, occupant = history.get(run.run_id, []), held[run.run_id], occupants.get(run.run_id)
        where = standing(run, trials, result, occupant)
        if where in (Standing.RECOVERED, Standing.REFERENCED):
            assert result is not None
            status = str(result.summary.status)
        elif where == Standing.MOVED:
            assert result is not None
            status = f"moved ({os.path.relpath(result.folder, run.run_dir.parent)})"
        elif where == Standing.OCCUPIED:
            assert occupant is not None
            status = f"occupied ({occupant.label})"
        else:
            status = shown[where] if where in shown else status_of(trials[-1])  # done, retry: the ledger's
        out[run.run_id] = f"{status} (stage {result.owner})" if result and result.owner else status
    return out


def read_history(stage: Stage) -> dict[str, list[FrozenTrial]] | None:
    """Run id -> its trials in every study of the stage's ledger (the storage it uses now); a damaged
    ledger is named in one line, and None: the statuses then come from the run folders."""
    try:
        ledgers = Ledger.read_all(stage.sweep_dir, stage.name, stage.base.sweep.storage)
    except LedgerDamaged as err:
        print(f"warning: {err}", file=sys.stderr)
        return None
    return merged_attempts(ledgers) if ledgers else None


def paper_numbers(run: Run) -> str:
    """The run's grid values that its scale changed, as the paper states them (d_model=256 for a d32 run)."""
    return " ".join(f"{k.rsplit('.', 1)[-1]}={run.params[k]}" for k in run.actual)


def recipe_line(stage: Stage, runs: Sequence[Run]) -> str | None:
    """How the scale maps the stage's other paper numbers, from the first run (the recipe is shared)."""
    if not runs:
        return None
    cfg = runs[0].config.cfg
    shown = [f"{k} {v} -> {OmegaConf.select(cfg, k)}" for k, v in cfg.scale.paper.items() if k not in runs[0].actual]
    return f"scale={stage.base.scale.name} maps the paper's numbers: " + ", ".join(shown) if shown else None


def columns(stage: Stage) -> list[str]:
    """COLUMNS, with each other key the stage varies (trainer.lr, ...) after `variant`."""
    extra = [k for k in stage.varied if k not in COLUMNS and k not in LABEL_SHOWS]
    at = COLUMNS.index("variant") + 1
    return [*COLUMNS[:at], *extra, *COLUMNS[at:]]


def rows(stage: Stage) -> list[dict[str, Any]]:
    """One row per run, in `columns(stage)` order and launch order."""
    history, found = read_history(stage), Results()
    known = launch_set(stage, history or {}, found)  # as the driver launches them
    runs, held, costs = known.runs, known.held, known.costs
    status = statuses(stage, runs, history, held, found.occupants)
    grid_index = {run.run_id: i for i, run in enumerate(runs)}
    pace = pace_here(stage)
    shared: dict[str, dict[str, Any]] = {}  # the columns of each configuration, read once (not per seed)
    here: dict[str, float] = {}  # each configuration's seconds on this machine
    out = []
    for run in known.in_order:
        if run.config.config_id not in shared:
            shared[run.config.config_id] = configuration_columns(stage, run.config.cfg)
            if pace:
                here[run.config.config_id] = seconds_here(pace, run, known.throughput)
        cost, result = costs[run.run_id], held[run.run_id]
        out.append(
            {
                "run_id": run.run_id,
                "label": run.label,
                **shared[run.config.config_id],
                "seed": run.seed,
                "variant": run.params.get("variant", "base"),
                "paper": paper_numbers(run),
                "params_stored": cost.params_stored,
                "params_effective": cost.params_effective,
                "tokens": cost.tokens,
                "train_flops": cost.flops,
                "gpu_hours": cost.gpu_hours,
                "status": status[run.run_id],
                "grid_index": grid_index[run.run_id],  # not a column: the makespan of the grid order
                "owner": result.owner if result else None,  # not a column: the stage that trained it, if another
                "done": result is not None,  # not a column: it has its result, so a launch skips it
                "here_s": here.get(run.config.config_id),  # not a column: its time on this machine
                "config_id": run.config.config_id,  # not a column: the seeds of one configuration share it
                "tokens_per_s": result.summary.tokens_per_s if result else None,  # not a column: as measured
            }
        )
    return out


def seconds_here(pace: Pace, run: Run, throughput: Throughput) -> float:
    """A run's time in its slot on this machine: its fixed cost, and its FLOPs at the rate finished runs of its
    shape reached (this machine's where none has)."""
    cfg = run.config.cfg
    flops = run_cost(cfg, throughput.assumed).flops
    return pace.run_seconds(flops, run_eval_flops(cfg), throughput.measured_for(cfg))


def configuration_columns(stage: Stage, cfg: DictConfig) -> dict[str, Any]:
    """The columns every seed of a configuration shares: its model, and each other key the stage varies."""
    m, applies = cfg.model, spec_of(cfg.model).shape_keys
    return {
        "model.name": m.name,
        "model.d_model": m.d_model,
        **{f"model.{key}": m[key] if key in applies else None for key in SHAPE_KEYS},
        **{k: OmegaConf.select(cfg, k) for k in stage.varied if k not in LABEL_SHOWS},
    }


def stage_slots(base: DictConfig) -> int:
    """The slots the stage would run on: plan.slots, else its pool's capacity."""
    if base.plan.slots is not None:
        if base.plan.slots < 1:
            raise ConfigError(f"plan.slots={base.plan.slots} must be >= 1")
        return base.plan.slots
    return capacity(base.launcher)


def charged(table_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the stage trains itself: a run another stage trained costs it nothing."""
    return [r for r in table_rows if not r["owner"]]


@cache  # rows, the time line and the throughput line of one plan read one pace
def pace_here(stage: Stage) -> Pace | None:
    """This machine's pace (sweep/pace.py), where no GPU is named (plan.gpu) and the stage would run here (the
    local launcher)."""
    named = any(line.partition("=")[0].lstrip("+~") == "plan.gpu" for line in stage.args.base)
    if named or not issubclass(pool_class(stage.base.launcher), LocalPool):
        return None
    try:
        return Pace.here(Path(stage.base.paths.runs), stage_slots(stage.base))
    except BenchmarkFailed as err:
        print(f"warning: {err}; no time on this machine", file=sys.stderr)
        return None


@dataclass(frozen=True)
class HereEstimate:
    """A stage's wall time on this machine: to start, to prepare its data (0: prepared), its runs' makespan."""

    pace: Pace
    runs: int  # the runs it still trains (a search: with those its trials still sample)
    done: int  # its own runs that have their results
    slots: int
    prepare_s: float
    runs_s: float

    @property
    def seconds(self) -> float:
        return self.pace.stage_start_s + self.prepare_s + self.runs_s


def here_estimate(stage: Stage, slots: int, table_rows: list[dict[str, Any]]) -> HereEstimate | None:
    """The stage's wall time on this machine from its pace, for the runs it still has to train (a search: the
    runs its trials still sample, each costed as its space's corners on average); None where a GPU is named or
    it runs elsewhere."""
    pace = pace_here(stage)
    if pace is None:
        return None
    own = charged(table_rows)
    left = [r["here_s"] for r in own if not r["done"]]
    done = len(own) - len(left)
    throughput = Throughput(pace.flops_per_s)
    if unsampled := max(0, stage.base.sweep.n_trials - len(table_rows)) if not stage.runs else 0:
        corners = [seconds_here(pace, stage.run(c), throughput) for c in stage.space.corners()]
        left += [sum(corners) / len(corners)] * unsampled
    known = {r["run_id"] for r in table_rows}
    left += [seconds_here(pace, run, throughput) for run in later_rungs(stage) if run.run_id not in known]
    if not left:
        return HereEstimate(pace, 0, done, slots, 0.0, 0.0)
    prepare = prepare_seconds(stage.base.data) or 0.0
    return HereEstimate(pace, len(left), done, slots, prepare, makespan(sorted(left, reverse=True), slots))


def later_rungs(stage: Stage) -> list[Run]:
    """A ladder's runs past its first rung, every configuration at the grid's seeds (none dropped: the ladder's
    lines below say what it expects); none for another stage."""
    rungs = list(stage.spec.rungs or [])
    return [stage.run({**run.params, STEPS: steps}) for run in stage.runs for steps in rungs[1:]]


def here_line(stage: Stage, slots: int, table_rows: list[dict[str, Any]]) -> str | None:
    """`here_estimate` in a line; `done` where no run is left to train."""
    if (est := here_estimate(stage, slots, table_rows)) is None or not (est.runs or est.done):
        return None
    if not est.runs:
        return f"on this machine: done (its {count(est.done, 'run')} have their results)"
    pace = est.pace
    done = f" ({est.done} done before)" if est.done else ""
    data = (
        f"; {duration(est.prepare_s / 3600)} of it preparing data={stage.base.data.name}, once" if est.prepare_s else ""
    )
    return (
        f"on this machine: about {duration(est.seconds / 3600)} for {count(est.runs, 'run')}{done} on "
        f"{count(slots, 'slot')} ({pace.stage_start_s:.0f} s to start; a run {pace.run_fixed_s:.1f} s besides its "
        f"FLOPs at {pace.flops_per_s / 1e9:,.1f} GFLOP/s, from {pace.basis}{data}); plan.gpu=NAME costs it on that "
        "GPU instead"
    )


def shared_throughput_line(stage: Stage, table_rows: list[dict[str, Any]]) -> str | None:
    """Where the stage ranks by throughput and its runs share this machine's cores (launcher.slots > 1 without a
    GPU) or a GPU (launcher.runs_per_gpu > 1), the noise that brings, as measured: each run's rate is what the
    runs beside it left it. None for a stage run elsewhere or ranked by another metric."""
    sweep = stage.base.sweep
    if THROUGHPUT not in (sweep.metric, *sweep.metrics) or pace_here(stage) is None:
        return None
    gpus = nvidia_gpus()
    sharing = stage.base.launcher.runs_per_gpu if gpus else stage_slots(stage.base)
    if sharing < 2:
        return None
    where = f"{sharing} runs to a GPU" if gpus else f"{sharing} runs on this machine's {os.cpu_count()} cores"
    return f"{THROUGHPUT} is measured with {where} at once: {throughput_spread(table_rows)}"


def throughput_spread(table_rows: list[dict[str, Any]]) -> str:
    """How far the tokens/s of one configuration's seeds spread, (max - min) / median, at most over the
    configurations with two or more measured."""
    spreads = seed_spreads((r["config_id"], r[THROUGHPUT]) for r in table_rows if r[THROUGHPUT])
    if not spreads:
        return (
            "its noise is not measured yet (no configuration has two seeds finished): read it from the spread of seeds"
        )
    return (
        f"across the seeds of one configuration it spread by up to {max(spreads):.0%} (median {median(spreads):.0%}, "
        f"{count(len(spreads), 'configuration')}): differences below that are the neighbours', not the runs'"
    )


def makespan_line(slots: int, table_rows: list[dict[str, Any]]) -> str:
    """The launch order's simulated wall time on `slots` of the runs the stage trains itself, against the lower
    bound and the grid order's."""
    hours = [r["gpu_hours"] for r in charged(table_rows)]
    by_grid = [r["gpu_hours"] for r in sorted(charged(table_rows), key=lambda r: r["grid_index"])]
    bound, ordered = makespan_bound(hours, slots), makespan(hours, slots)
    ratio = (lambda h: f"{h / bound:.3f}x") if bound > 0 else (lambda h: "-")
    return (
        f"makespan on {count(slots, 'slot')}: {ordered:,.2f} h in launch order ({ratio(ordered)} the lower bound "
        f"{bound:,.2f} h = max(total / slots, longest run)); grid order: {makespan(by_grid, slots):,.2f} h "
        f"({ratio(makespan(by_grid, slots))})"
    )


def _si(value: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"


def _writer(key: str) -> Callable[[Any], str]:
    """How the column `key` writes a value other than None ("-"): chosen once per column, as a table's cells are
    written twice; a number's text kept (the seeds of a configuration share their costs). An axis's float (a
    sampled lr) as the run's label writes it: 3.16e-3, not 0.0031622776601683794."""
    if key.startswith("params_") or key == "tokens":
        return cache(_si)
    formats = {"train_flops": "{:.3g}".format, "gpu_hours": "{:,.2f}".format}
    return cache(formats[key]) if key in formats else _axis_value


def _axis_value(value: Any) -> str:
    return short_value(value) if isinstance(value, float) else str(value)


def print_table(stage: Stage, table_rows: list[dict[str, Any]], slots: int) -> None:
    p = stage.base.plan
    own = charged(table_rows)
    total_flops = sum(r["train_flops"] for r in own)
    total_hours = sum(r["gpu_hours"] for r in own)
    others = (
        f" ({count(len(table_rows) - len(own), 'run')} another stage trained left out)" if own != table_rows else ""
    )
    print(f"stage {stage.name} at scale={stage.base.scale.name}: {count(len(table_rows), 'run')}")
    shown = columns(stage)
    writers = [(k, _writer(k)) for k in shown]

    def cells() -> Iterator[list[str]]:
        return (["-" if (v := row[k]) is None else write(v) for k, write in writers] for row in table_rows)

    header = [k.removeprefix("model.") for k in shown]
    sys.stdout.writelines(f"{line}\n" for line in aligned(header, cells, left={"label", "status"}))
    console = Console(width=400)
    if line := recipe_line(stage, stage.known_runs({})):
        console.print(line, highlight=False)
    if not stage.runs:
        console.print(
            f"search: {count(len(table_rows), 'run')} sampled so far, of sweep.n_trials={stage.base.sweep.n_trials} "
            "trials (a trial that samples a run again takes its result: docs/decisions.md)"
        )
    console.print(
        f"total: {total_flops:.3g} training FLOPs = {total_hours:,.1f} GPU-hours ({total_hours / 24:,.2f} GPU-days) "
        f"on one {p.gpu} at {p.mfu:.0%} MFU{others}; ledger status from {stage.sweep_dir}",
        highlight=False,
    )
    console.print(makespan_line(slots, table_rows), highlight=False)
    if line := here_line(stage, slots, table_rows):
        console.print(line, highlight=False)
    if line := shared_throughput_line(stage, table_rows):
        console.print(line, highlight=False)
    if line := runset_line(stage):
        console.print(line, highlight=False)
    for screened in stage.screened:  # stage.select=zoom: why each width's candidates
        console.print(screened.line(), highlight=False)
    here = all(r["here_s"] is not None for r in table_rows)  # the rule's times: this machine's where it runs here
    hours = {r["run_id"]: r["here_s"] / 3600 if here else r["gpu_hours"] for r in table_rows}
    if lines := stage.rule.plan_lines(hours):
        unit = "on this machine, at its pace above" if here else f"on one {p.gpu} at {p.mfu:.0%} MFU, as the total"
        console.print(f"the rule's times: run time summed over its runs, {unit}", highlight=False)
    for line in lines:
        console.print(line, highlight=False)


def aligned(header: list[str], cells: Callable[[], Iterable[list[str]]], left: set[str]) -> Iterator[str]:
    """A plain text table, line by line: each column as wide as its widest cell, text columns (`left`) left-aligned,
    numbers right-aligned. Plain, because rich took 30 s to lay out a 10,240-run stage; its cells are made twice,
    to measure and to print, not kept (a 100,000-run plan's cells and lines took ~110 MB)."""
    widths = [len(h) for h in header]
    for row in cells():
        widths = list(map(max, widths, map(len, row)))

    justs = [str.ljust if h in left else str.rjust for h in header]

    def line(row: list[str]) -> str:
        return "  ".join([just(c, w) for just, c, w in zip(justs, row, widths, strict=True)]).rstrip()

    yield line(header)
    yield "  ".join("-" * w for w in widths)
    yield from map(line, cells())


def runset_line(stage: Stage) -> str | None:
    """What the stage's conclusions use so far (the analysis and zoom read the same runs); None before it ran."""
    try:
        runs = stage_runs(Path(stage.base.paths.runs), stage.name, scale=stage.base.scale.name)
    except LedgerDamaged:
        return None
    if not runs.used and not runs.pending and not runs.left_out:
        return None
    left = Counter(o.kind for o in runs.left_out)
    changed = ", ".join(sorted({d for o in runs.left_out for d in o.differs}))  # what superseded runs differ in
    parts = [f"{n} {kind}" + (f" ({changed})" if kind == "superseded" and changed else "") for kind, n in left.items()]
    parts += [f"{len(runs.pending)} without a result yet"] if runs.pending else []
    parts += [f"{len(runs.missing)} missing their folder"] if runs.missing else []
    return f"its tables use {len(runs.used)} runs ({runs.basis})" + (f"; left out: {', '.join(parts)}" if parts else "")


def main(argv: list[str]) -> None:
    stage = Stage(argv)
    check_stage_settings(stage, stage_configs(stage)[1])  # what the driver refuses of the stage's own settings
    fmt = stage.base.plan.format
    slots = stage_slots(stage.base)
    table_rows = rows(stage)
    if fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=columns(stage), lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table_rows)
        print(makespan_line(slots, table_rows), file=sys.stderr)
        if line := here_line(stage, slots, table_rows):
            print(line, file=sys.stderr)
        for screened in stage.screened:
            print(screened.line(), file=sys.stderr)
    else:
        print_table(stage, table_rows, slots)


if __name__ == "__main__":
    run_cli(main, USAGE)
