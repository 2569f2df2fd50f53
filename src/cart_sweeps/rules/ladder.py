"""A ladder stage (`stage.rungs`, docs/ladder.md): its grid runs at the first horizon, each later rung's runs are
of the configurations the walk (rules/ladder_walk.py) keeps, and what runs next follows from the run set alone,
so a relaunch recomputes the same ladder; `stage.branch=true` branches them (docs/wsd.md)."""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cart_sweeps.config import ConfigError
from cart_sweeps.record.branch import checkpoint_problem
from cart_sweeps.record.runfolder import atomic_write
from cart_sweeps.rules.axes import SEED, STEPS, D
from cart_sweeps.rules.bound import floor_line
from cart_sweeps.rules.decide import seed_order
from cart_sweeps.rules.ladder_walk import DRIFT_PRIOR, RECORD, RECORD_FILE, Call, Design, Walk, group_name, name, walk
from cart_sweeps.rules.rule import Added, Expanded, StageRule
from cart_sweeps.rules.seeds import ranked_by
from cart_sweeps.rules.simulation import expected_lines, stage_grid
from cart_sweeps.rules.zoom import drift_allowance, promoted, screen
from cart_sweeps.schedule import Schedule, branchable
from cart_sweeps.stagerecord.runset import Cell, stage_runs
from cart_sweeps.text import duration

if TYPE_CHECKING:
    from cart_sweeps.stagerecord.ledger import Ledger

BRANCH_KEYS = ("trainer.keep_checkpoints_at", "trainer.branch_from", "trainer.branch_step")  # stage.branch sets


class LadderRule(StageRule):
    """A ladder's rule (`stage.rungs`)."""

    def grid(self, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Every run's horizon is a param (its first rung's runs are the grid's)."""
        return {**axes, STEPS: list(self.stage.spec.rungs)}

    def first(self, point: dict[str, Any]) -> bool:
        return bool(point[STEPS] == self.stage.spec.rungs[0])

    def check_own(self) -> None:
        """Refuse, in one line, a ladder this stage cannot run."""
        stage, spec = self.stage, self.stage.spec
        rungs = list(spec.rungs)
        if len(rungs) < 2 or any(not isinstance(h, int) or h < 1 for h in rungs) or rungs != sorted(set(rungs)):
            raise ConfigError(f"stage.rungs={rungs} must be two or more increasing step counts (paper numbers)")
        if STEPS in spec.grid or STEPS in stage.args.passed or STEPS in stage.args.axes:
            raise ConfigError(f"stage.rungs sets each run's {STEPS}: drop {STEPS} from the grid and the command line")
        if not stage.runs:
            raise ConfigError("stage.rungs runs a grid, not a search")
        if len(stage.axes.get(SEED, [])) < 2:
            raise ConfigError(
                f"stage.rungs drops only what the rung's seed noise tells apart: stage {stage.name} needs a grid over "
                "at least two seeds (seed=42,137)"
            )
        self.check_max_seeds()
        if spec.branch:
            schedules = [run.config.cfg.trainer.schedule for run in stage.runs]
            if not (schedules and all(map(branchable, [*schedules, spec.recipe.get("trainer.schedule")]))):
                raise ConfigError(
                    "stage.branch=true continues each run's stable phase: it needs trainer.schedule: wsd in the stage "
                    "file's recipe (a cosine spans each run's own length; the recipe's wsd warms every horizon up "
                    "alike), or drop stage.branch"
                )
            if passed := [k for k in BRANCH_KEYS if k in stage.args.passed]:
                raise ConfigError(f"stage.branch=true sets each run's {passed[0]}: drop it from the command line")

    def looks(self) -> int:
        """Each rung's looks (a ladder decides at each rung)."""
        return super().looks() * len(self.stage.spec.rungs)

    def added_here(self) -> Callable[[dict[str, Any]], bool] | None:
        """An added run is this launch's where this ladder's walk reached its cell or wants it now; another (a
        dropped configuration's, or an earlier ladder's) waits, untrained."""
        stage, state = self.stage, current(self.stage)
        rung_of = {h: k for k, h in enumerate(stage.spec.rungs)}
        judged = {(k, g, o.level) for (k, g), j in state.judged.items() for o in j.options}
        wanted = {(w.rung, w.group, w.config, w.seed) for w in state.wants}

        def ours(params: dict[str, Any]) -> bool:
            if params.get(STEPS) not in rung_of:
                return False
            cell = (rung_of[params[STEPS]], *split(stage, params))
            return cell in judged or (*cell, params.get(SEED)) in wanted

        return ours

    def next_round(self, ledger: Ledger, say: Callable[[str], None]) -> list[Added]:
        """The runs the ladder adds now, each with why; its records go to the ledger and the stage folder."""
        stage = self.stage
        state = current(stage)
        new = record(stage, ledger, state, say)
        for call in new:
            if call.action != "promoted":
                say(f"stage {stage.name}: {call.action}: {call.reason}")
        grid = {run.run_id for run in stage.runs}
        wanted = [Added(stage.run(params_of(stage, w.rung, w.group, w.config, w.seed)), w.why) for w in state.wants]
        return [a for a in wanted if a.run.run_id not in grid]

    def plan_lines(self, hours: dict[str, float]) -> list[str]:
        """What `plan` says of a ladder: per rung (in paper steps and the steps its runs train here) its runs and
        time at most, and as measured so far or if nothing is dropped; the paper's fixed design on the grid; what
        the simulator expects it to spend under a clear winner and a tie (the one figure called expected), and
        the floor."""
        stage = self.stage
        d, state = design(stage), current(stage)
        per, mapped, trained = _hours_per_config(stage, hours), _mapped(stage), horizons(stage)
        configs = [(g, c) for g, cs in groups(stage).items() for c in cs]
        lines = [
            f"ladder: rungs {list(d.rungs)} steps, {d.first} seeds per cell (at most {d.most}), alpha {d.alpha:g} / "
            f"{d.looks} looks; drift prior {d.prior:.2%} per ln-horizon (stage.drift)"
            + (f"; equivalent within {d.equivalence:.2%} (stage.equivalence)" if d.equivalence is not None else "")
        ]
        if d.branch is not None:
            lines.append(
                "  branched (stage.branch): a promoted run trains past the previous rung's decay start, a rung "
                f"{'/'.join(str(d.steps(k, True)) for k in range(len(d.rungs)))} steps; a seed first run at a rung, "
                "fresh"
            )
        total_most = total_kept = 0.0
        alive = configs
        for k, h in enumerate(d.rungs):
            settled = [c for c in state.calls if c.rung == k - 1]
            if k and settled:
                alive = [(c.group, c.config) for c in settled if c.action == "promoted"]
            seeds = [n for (r, _), j in state.judged.items() if r == k for n in [j.options[0].seeds] if j.options]
            n_seeds = max(seeds, default=d.first)
            grid_steps, more_steps = d.steps(k, branched=True), d.steps(k, branched=False)  # more seeds: fresh
            most = sum(per[key] for key in configs) * (d.first * grid_steps + (d.most - d.first) * more_steps)
            kept = sum(per[key] for key in alive) * (d.first * grid_steps + (n_seeds - d.first) * more_steps)
            most, kept = most * mapped[k], kept * mapped[k]
            total_most, total_kept = total_most + most, total_kept + kept
            basis = "as measured so far" if (k == 0 or settled) and state.judged else "if nothing is dropped"
            here = f"{h:,} steps" if trained[k] == h else f"{h:,} paper steps: {trained[k]:,} here"
            lines.append(
                f"  rung {k + 1} ({here}): at most {len(configs) * d.most} runs, {duration(most)} of run time; "
                f"{len(alive) * n_seeds} runs, {duration(kept)} {basis}"
            )
        lines.append(
            f"  total: {duration(total_most)} of run time at most, {duration(total_kept)} if nothing more is dropped "
            "(summed over runs, not wall time on the slots); the "
            f"paper's fixed design on this grid (1 seed at {d.rungs[0]:,}, the zoom's candidates x 3 seeds at "
            f"{d.rungs[-1]:,}): {duration(_fixed(stage, state, per, d, mapped[-1]))}; the expected compute, with "
            "drops: simulated below"
        )
        first = [run for run in stage.runs if run.params.get(SEED) == stage.axes[SEED][0]]
        by_group = [[run for run in first if split(stage, run.params)[0] == g] for g in groups(stage)]
        lines += [f"  {line}" for line in expected_lines(stage_grid(stage, by_group), d, d.equivalence)]
        for (k, g), j in state.judged.items():  # the floor at the last rung each width was judged at
            if k == max(r for r, h in state.judged if h == g) and j.noise is not None and j.noise.measurable:
                costs = [per[(g, o.level)] * d.rungs[-1] for o in j.options]
                lines.append(f"  {group_name(g)}: {floor_line(j.options, j.noise.sd, d.alpha, d.equivalence, costs)}")
        return lines

    def launch_overrides(self, run: Any) -> list[str]:
        """`stage.branch=true`: a run below the last rung keeps its checkpoint at its decay start (the last step
        every longer run of it shares), one above the first starts from the previous rung's there where held. No
        part of a run's identity, so a relaunch resumes or skips it as the same run either way."""
        stage = self.stage
        rungs = list(stage.spec.rungs)
        if not stage.spec.branch:
            return []
        k = rungs.index(run.params[STEPS])
        start = Schedule.of(run.config.cfg.trainer).decay_start
        out = [f"trainer.keep_checkpoints_at=[{start}]"] if k < len(rungs) - 1 else []
        if k > 0:
            parent = stage.run({**run.params, STEPS: rungs[k - 1]})
            step = Schedule.of(parent.config.cfg.trainer).decay_start
            if checkpoint_problem(parent.run_dir, step, parent.run_id) is None:  # else fresh: the run it would equal
                out += [f"trainer.branch_from={parent.run_dir}", f"trainer.branch_step={step}"]
        return out


def design(stage: Expanded) -> Design:
    """The stage's ladder: its rungs, seeds, most seeds, metric, prior drift and alpha."""
    spec, grid_seeds = stage.spec, stage.axes[SEED]
    prior = DRIFT_PRIOR if spec.drift is None else float(spec.drift)
    most = spec.max_seeds if spec.max_seeds is not None else len(grid_seeds)
    branch = float(stage.runs[0].config.cfg.trainer.decay_fraction) if spec.branch and stage.runs else None
    rungs, seeds = tuple(spec.rungs), tuple(seed_order(grid_seeds))
    return Design(rungs, seeds, len(grid_seeds), most, ranked_by(stage), prior, branch=branch,
                  equivalence=spec.equivalence)  # fmt: skip


def split(stage: Expanded, params: dict[str, Any]) -> tuple[Any, Cell]:
    """A run's (decision group, configuration): its width (the grid's, else the recipe's, else None), and its
    params less width, seed and horizon."""
    config = tuple(sorted((k, v) for k, v in params.items() if k not in (D, SEED, STEPS)))
    return params.get(D, stage.recipe.get(D)), config


def groups(stage: Expanded) -> dict[Any, list[Cell]]:
    """Each width's configurations, as the grid lists them."""
    out: dict[Any, list[Cell]] = defaultdict(list)
    for run in stage.runs:
        if run.params.get(SEED) == stage.axes[SEED][0]:
            group, config = split(stage, run.params)
            out[group].append(config)
    return dict(out)


def current(stage: Expanded) -> Walk:
    """The ladder on the stage's results so far (the runs its conclusions use)."""
    rung_of = {h: k for k, h in enumerate(stage.spec.rungs)}
    data: dict[tuple[int, Any, Cell], dict[int, float]] = defaultdict(dict)
    metric = stage.base.sweep.metric
    for run in stage_runs(Path(stage.base.paths.runs), stage.name).used:
        value = run.summary.value(metric) if run.summary else None
        if value is not None and run.params.get(STEPS) in rung_of and SEED in run.params:
            group, config = split(stage, run.params)
            data[(rung_of[run.params[STEPS]], group, config)][int(run.params[SEED])] = value
    return walk(design(stage), groups(stage), data)


def params_of(stage: Expanded, rung: int, group: Any, config: Cell, seed: int) -> dict[str, Any]:
    """The grid point of a configuration at a rung and seed (paper numbers)."""
    return {**({D: group} if D in stage.axes else {}), **dict(config), STEPS: stage.spec.rungs[rung], SEED: seed}


def record(stage: Expanded, ledger: Ledger, state: Walk, say: Callable[[str], None]) -> list[Call]:
    """Write the ladder's records (ledger, RECORD_FILE); returns the new ones. A ladder of another design is a new
    ladder: the recorded one's file is kept beside it (`ladder~<digest>.json`), said in one line."""
    rows = [as_row(c) for c in state.calls]
    d = design(stage)
    drift = {str(k): {"rate": v.rate, "source": v.source, "interval": v.interval} for k, v in state.drift.items()}
    shown = {"rungs": list(d.rungs), "seeds": list(d.seeds[: d.most]), "grid_seeds": d.first, "prior": d.prior}
    shown |= {"alpha": d.alpha, "looks": d.looks, "equivalence": d.equivalence}
    path = stage.sweep_dir / RECORD_FILE
    before = ledger.study.user_attrs.get(RECORD, [])
    recorded, steps = _recorded_design(path)
    if recorded is not None and recorded != shown:
        say(_new_ladder(stage, path, recorded, shown))
        before, steps = [], {}  # the new ladder's records are all its own
    steps[stage.base.scale.name] = horizons(stage)
    ledger.study.set_user_attr(RECORD, rows)
    payload = {"design": shown | {"steps": steps}, "drift": drift, "records": rows}
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n"))
    return [c for c, row in zip(state.calls, rows, strict=True) if row not in before]


def _recorded_design(path: Path) -> tuple[dict[str, Any] | None, dict[str, list[int]]]:
    """The design a ladder's record names (None: none), and apart, its rungs' steps per scale launched."""
    try:
        shown = json.loads(path.read_text())["design"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, {}
    steps = shown.get("steps")
    return {k: v for k, v in shown.items() if k != "steps"}, dict(steps) if isinstance(steps, dict) else {}


def _aside(path: Path, shown: dict[str, Any]) -> Path:
    """Where the record of the ladder of design `shown` is kept while another is the stage's newest."""
    digest = hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()[:8]
    return path.with_name(f"{path.stem}~{digest}{path.suffix}")


SETTINGS = {"rungs": "stage.rungs", "prior": "stage.drift", "equivalence": "stage.equivalence"}  # as a launch sets


def _new_ladder(stage: Expanded, path: Path, recorded: dict[str, Any], shown: dict[str, Any]) -> str:
    """Set the recorded ladder's file aside (a ladder of this design recorded before comes back) and say so."""
    text = lambda v: f"{v:g}" if isinstance(v, float) else str(v)  # noqa: E731
    changed = [
        f"{SETTINGS.get(k, k)}={text(v)} (recorded: {text(recorded.get(k))})"
        for k, v in shown.items()
        if v != recorded.get(k) and k != "looks"  # the looks follow from the rungs and seeds
    ]
    aside, back = _aside(path, recorded), _aside(path, shown)
    os.replace(path, aside)
    which = f"back to the ladder kept as {back.name}" if back.exists() else "a new ladder"
    back.unlink(missing_ok=True)
    return (
        f"stage {stage.name}: {which}: {'; '.join(changed)}; the recorded one is kept beside it as {aside.name}; "
        "runs the two share are trained once"
    )


def horizons(stage: Expanded) -> list[int]:
    """The steps each rung's runs train at the stage's scale (the analysis finds a run's rung by them)."""
    first = stage.runs[0].params
    return [int(stage.run({**first, STEPS: h}).config.cfg.trainer.steps) for h in stage.spec.rungs]


def as_row(call: Call) -> dict[str, Any]:
    return {
        "rung": call.rung + 1,
        "steps": call.horizon,
        "group": group_name(call.group),
        "config": name(call.config),
        "action": call.action,
        "reason": call.reason,
    }


def _fixed(stage: Expanded, state: Walk, per: dict[tuple[Any, Cell], float], d: Design, last: float) -> float:
    """GPU-hours of the paper's two stages on the grid: the screen, and per width the zoom's candidates (two axes;
    else the best three), 3 seeds each; `last`: the last rung's `_mapped`. Where the first rung is measured, the
    zoom reads its ranking, seeds and noise (rules/zoom.screen, at the ladder's prior to its last rung), else the
    grid's order (the cross of its first cell)."""
    hours = sum(per.values()) * d.rungs[0]
    for g, cs in groups(stage).items():
        j = state.judged.get((0, g))
        rank = {o.level: o.rank for o in j.options} if j else {}
        ranked = sorted(cs, key=lambda c: rank.get(c, 0.0))
        if len(cs[0]) == 2:
            rp = {(c[0][1], c[1][1]): c for c in cs}
            if j is not None and len(j.options) == len(cs):
                opts = [replace(o, level=(o.level[0][1], o.level[1][1])) for o in j.options]
                allowed = drift_allowance(d.rungs[0], d.rungs[-1], d.prior)
                noise = j.noise if j.noise is not None and j.noise.measurable else None  # else the stated prior
                chosen_rp = screen(g, opts, d.metric, allowed, noise).cells
            else:
                chosen_rp = promoted([(c[0][1], c[1][1]) for c in ranked])
            chosen = [rp[c] for c in chosen_rp if c in rp]
        else:
            chosen = ranked[:3]
        hours += sum(per[(g, c)] for c in chosen) * d.rungs[-1] * 3 * last
    return hours


def _mapped(stage: Expanded) -> list[float]:
    """Each rung's trained steps per paper step, relative to the first rung's (the scale maps them unevenly)."""
    trained = [t / r for t, r in zip(horizons(stage), stage.spec.rungs, strict=True)]
    return [t / trained[0] for t in trained]


def _hours_per_config(stage: Expanded, hours: dict[str, float]) -> dict[tuple[Any, Cell], float]:
    """GPU-hours per step of each configuration, from its first-rung run's estimate."""
    out: dict[tuple[Any, Cell], float] = {}
    for run in stage.runs:
        key = split(stage, run.params)
        out[key] = max(out.get(key, 0.0), hours.get(run.run_id, 0.0) / stage.spec.rungs[0])
    return out
