"""The seeds a stage adds after its grid (docs/statistics.md): `stage.replicates=K` re-runs a screen's K best per
width with REPLICATE_SEEDS more; `stage.max_seeds=N` adds a seed to a width's cells while its best R is open.
From a fixed seed list and the run set alone, so a relaunch recomputes the same rounds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cart_sweeps.config import ConfigError
from cart_sweeps.metric import Metric, require
from cart_sweeps.rules.axes import SEED, D, R
from cart_sweeps.rules.bound import floor_line
from cart_sweeps.rules.decide import (
    ALPHA,
    MOST_SEEDS,
    POWER,
    Verdict,
    best_level,
    look_level,
    seed_order,
    seeds_for_power,
    seeds_in_every,
)
from cart_sweeps.rules.ladder_walk import name
from cart_sweeps.rules.rule import Added, Expanded, StageRule
from cart_sweeps.rules.simulation import expected_lines, stage_grid
from cart_sweeps.stagerecord.runset import Cell, StageRun, cell_of, stage_runs
from cart_sweeps.text import count, duration

if TYPE_CHECKING:
    from cart_sweeps.stagerecord.ledger import Ledger

REPLICATE_SEEDS = 2  # a replicated screen configuration runs 1 + 2 seeds: 2 df of noise each


class SeedRule(StageRule):
    """A grid stage's rule: its grid, and the seeds stage.max_seeds or stage.replicates add."""

    def check_own(self) -> None:
        stage, spec = self.stage, self.stage.spec
        if spec.max_seeds is not None:
            if spec.replicates:
                raise ConfigError(
                    "stage.max_seeds and stage.replicates both add seeds: use one (replicates for a screen)"
                )
            if SEED not in stage.axes or len(stage.axes.get(R, [])) < 2:
                raise ConfigError(
                    f"stage.max_seeds adds seeds where the best R is undecided: stage {stage.name} needs a grid over "
                    f"seed and over at least two {R} (it has {sorted(stage.axes)})"
                )
            self.check_max_seeds(" (the seeds of the list in cart_sweeps.rules.decide)")
        if spec.branch:
            raise ConfigError("stage.branch=true branches a ladder's rungs: set stage.rungs=[...] too")

    def spending_from(self) -> int | None:
        return len(self.stage.axes[SEED]) if self.stage.spec.max_seeds is not None else None

    def added_here(self) -> Callable[[dict[str, Any]], bool] | None:
        cells = {cell_of(run.params) for run in self.stage.runs}
        return (lambda params: cell_of(params) in cells) if self.adds() else None

    def next_round(self, ledger: Ledger, say: Callable[[str], None]) -> list[Added]:
        """The runs the rule adds now (none while a cell lacks a result it needs, or once nothing is open)."""
        stage = self.stage
        if not self.adds():
            return []
        grid = {cell_of(run.params): run.params for run in stage.runs}
        used = stage_runs(Path(stage.base.paths.runs), stage.name, scale=stage.base.scale.name).used
        values = _values(used, grid, stage.base.sweep.metric)
        if stage.spec.max_seeds is not None:
            return self._seeds_round(grid, values)
        own = {_seed(r) for r in used if r.cell in grid and SEED not in r.params}  # the screen's own seed
        return self._replicates(grid, values, own.pop()) if len(own) == 1 else []

    def _seeds_round(self, grid: dict[Cell, Any], values: dict[Cell, dict[int, float]]) -> list[Added]:
        stage = self.stage
        assert stage.spec.max_seeds is not None
        order = seed_order(stage.axes[SEED])
        first, most = len(stage.axes[SEED]), stage.spec.max_seeds
        out = []
        for key, cells, have, verdict in self._decisions(grid, values):
            if have < first or have >= most or verdict.decided or len(verdict.options) < 2:  # not open, or at most
                continue
            seed = order[have]
            said = f"undecided with {count(have, 'seed')} ({_open(verdict)})"
            why = f"round {have - first + 1}: best R at {_where(key)} {said}"
            out += [Added(stage.run({**grid[c], SEED: seed}), f"{why}; seed {seed} added") for c in cells]
        return out

    def _decisions(
        self, grid: dict[Cell, Any], values: dict[Cell, dict[int, float]]
    ) -> Iterator[tuple[Cell, list[Cell], int, Verdict]]:
        """Per width with results: its cells, the seeds every cell has, and its best-R decision on those."""
        order = seed_order(self.stage.axes[SEED])
        for key, cells in _by_width(grid).items():
            if have := seeds_in_every(order, [values.get(c, {}) for c in cells]):
                options = {dict(c)[R]: [values[c][s] for s in order[:have]] for c in cells}
                level = look_level(ALPHA, max(1, have - len(self.stage.axes[SEED]) + 1), self.looks())
                verdict = best_level(
                    options, ranked_by(self.stage), equivalence=self.stage.spec.equivalence, level=level
                )
                yield key, cells, have, verdict

    def _replicates(self, grid: dict[Cell, Any], values: dict[Cell, dict[int, float]], base: int) -> list[Added]:
        """Per width whose screen is all in, its `replicates` best cells by the screen's own seed `base`."""
        stage = self.stage
        by_width: dict[Any, list[tuple[float, Cell]]] = defaultdict(list)
        for cell in grid:
            if base in values.get(cell, {}):
                by_width[dict(cell)[D]].append((values[cell][base], cell))
        seeds = seed_order([base])[1 : 1 + REPLICATE_SEEDS]
        out = []
        for d, ranked in by_width.items():
            if len(ranked) < sum(dict(c)[D] == d for c in grid):  # the width's screen is not all in
                continue
            best_first = sorted(ranked, key=lambda pair: ranked_by(stage).sign * pair[0])
            for rank, (_, cell) in enumerate(best_first[: stage.spec.replicates], 1):
                why = f"replicate: rank {rank} of {_where(((D, d),))} by seed {base}"
                out += [
                    Added(stage.run({**grid[cell], SEED: s}), f"{why}; seed {s}")
                    for s in seeds
                    if s not in values[cell]
                ]
        return out

    def plan_lines(self, hours: dict[str, float]) -> list[str]:
        """What `plan` says of the seeds the stage adds: the replicates' cost, or (stage.max_seeds) what the
        simulator expects them to spend under a clear winner and a tie, and per width its decision now and the seeds
        for POWER at the observed margin and noise."""
        stage = self.stage
        grid = {cell_of(run.params): run for run in stage.runs}
        if stage.spec.replicates:
            widths = {dict(c)[D] for c in grid}
            per = [max(hours.get(run.run_id, 0.0) for c, run in grid.items() if dict(c)[D] == d) for d in widths]
            n = stage.spec.replicates * REPLICATE_SEEDS
            return [
                f"stage.replicates={stage.spec.replicates}: after the grid, per width its {stage.spec.replicates} "
                f"best configurations run {REPLICATE_SEEDS} more seeds: {n * len(widths)} runs, at most "
                f"{duration(n * sum(per))}"
            ]
        if SEED not in stage.axes or len(stage.axes.get(R, [])) < 2:
            return []
        expected = []
        if stage.spec.max_seeds is not None:
            groups = [[grid[c] for c in cells] for cells in _by_width(grid).values()]
            sizes = (len(stage.axes[SEED]), stage.spec.max_seeds)
            expected = expected_lines(stage_grid(stage, groups), sizes, stage.spec.equivalence)
        used = stage_runs(Path(stage.base.paths.runs), stage.name, scale=stage.base.scale.name).used
        values = _values(used, {c: run.params for c, run in grid.items()}, stage.base.sweep.metric)
        if not values:
            return expected
        n_looks = self.looks()
        spending = (
            f"alpha {ALPHA:g} spent over {n_looks} looks (O'Brien-Fleming-like)" if n_looks > 1 else f"alpha {ALPHA:g}"
        )
        lines = [*expected, f"decisions now ({spending}; seeds for {POWER:.0%} power):"]
        for key, cells, have, verdict in self._decisions(grid, values):
            same = ", ".join(f"R={e}" for e in verdict.equivalent)
            if len(verdict.options) < 2:  # a zoom's cell past the grid's edge: one R in its group
                lines.append(f"  {_where(key)}: {have} seeds per cell, R={verdict.choice} alone: nothing to compare")
                continue
            said = (
                f"R={verdict.choice} decided"
                if verdict.best
                else f"R={verdict.choice} equivalent to {same}"
                if verdict.decided
                else f"undecided ({_open(verdict)})"
            )
            needed = _needed(verdict, have, n_looks, sum(hours.get(grid[c].run_id, 0.0) for c in cells))
            lines.append(f"  {_where(key)}: {have} seeds per cell, {said}; {needed}")
            if verdict.noise is not None and verdict.noise.measurable:
                cost = {dict(c)[R]: hours.get(grid[c].run_id, 0.0) for c in cells}
                margin = self.stage.spec.equivalence
                costs = [cost[o.level] for o in verdict.options]
                lines.append(f"    {floor_line(verdict.options, verdict.noise.sd, ALPHA, margin, costs)}")
        return lines


def _by_width(grid: dict[Cell, Any]) -> dict[Cell, list[Cell]]:
    """The grid's cells by their key less R: the options of one best-R decision."""
    groups: dict[Cell, list[Cell]] = defaultdict(list)
    for cell in grid:
        groups[tuple((k, v) for k, v in cell if k != R)].append(cell)
    return groups


def _seed(run: StageRun) -> int:
    """A run's seed: its grid point's, else (a screen's seed is in its recipe) the one its summary records."""
    return int(run.params[SEED] if SEED in run.params else (run.summary.details if run.summary else {})[SEED])


def ranked_by(stage: Expanded) -> Metric:
    """The stage's sweep metric, whose record says which way is better."""
    return require(stage.base.sweep.metric)


def _values(used: list[StageRun], grid: dict[Cell, Any], metric: str) -> dict[Cell, dict[int, float]]:
    """Per cell of this launch: seed -> its run's metric."""
    out: dict[Cell, dict[int, float]] = defaultdict(dict)
    for run in used:
        value = run.summary.value(metric) if run.summary else None
        if run.cell in grid and value is not None and run.summary is not None:
            out[run.cell][_seed(run)] = value
    return out


def _needed(verdict: Verdict, have: int, n_looks: int, per_seed: float) -> str:
    """The seeds per cell for POWER, and the time of those to add (`per_seed`: a seed of every cell)."""
    if verdict.noise is None:
        return "no seed spread to size it from"
    best, runner = verdict.options[0], verdict.options[1]
    n = seeds_for_power(runner.score_mean - best.score_mean, verdict.noise.sd, ALPHA / n_looks, len(verdict.options))
    if n is None:
        return f"no seed count up to {MOST_SEEDS:,} decides this margin"
    cost = max(0, n - have) * per_seed
    return f"{n} seeds per cell for {POWER:.0%} power ({max(0, n - have)} more: {duration(cost)})"


def _where(key: Cell) -> str:
    return name(key) if key else "the stage"


def _open(verdict: Verdict) -> str:
    if verdict.noise is None:
        return "no seed spread"
    tied = ", ".join(f"R={t}" for t in verdict.tied)
    return f"R={verdict.choice} not told from {tied}, p={verdict.p_value:.2g}"
