"""A stage expanded into its runs: each composed from the real conf/ tree and validated before any launches.

Both the sweeper and `plan` go through `load_stage`, so a run's overrides, run id and folder are the
same whether it is planned or launched.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial

from cart_sweeps.collector import long_lived
from cart_sweeps.compose import config_dirs, parse_overrides
from cart_sweeps.composer import Composer
from cart_sweeps.config import ConfigError, ScaleConfig
from cart_sweeps.identity import GROUPS, NON_IDENTITY_KEYS, SeededIds, digest, identity
from cart_sweeps.model import dense_parity
from cart_sweeps.naming import LABEL_SHOWS, check_stage_name, label_parts, run_folder, seeded_label, stage_folder
from cart_sweeps.options import Sampler, StageKind, StageNumbers
from cart_sweeps.record.runfolder import with_source
from cart_sweeps.register import stage_paths
from cart_sweeps.roles import check_claim
from cart_sweeps.rules import for_stage
from cart_sweeps.rules.zoom import ZOOM_AXES, Screened, best_single_run, drift_allowance, screen_steps, zoom_candidates
from cart_sweeps.stagerecord.runset import RunSet, stage_runs
from cart_sweeps.sweep import objectives, samplers, space
from cart_sweeps.sweep.overrides import Arguments, split_arguments
from cart_sweeps.sweep.scale import check_apart, to_paper, to_scale
from cart_sweeps.text import axis_value, format_value
from cart_sweeps.validate import check_interpolations, validate

VARIANT = "variant"  # the grid axis over a stage's named variants
PARITY = "dense_parity"  # a variant key: derive model.n_layers at parity with the point's CART model


@dataclass(frozen=True)
class Configuration:
    """What the seeds of one configuration share, composed, validated and named once: a stage of 64
    configurations x 160 seeds holds 64 configs, not 10,240 (~190 KB each)."""

    cfg: DictConfig  # composed at the seed of the first of its runs: read it for anything but the seed
    config_id: str
    seeded_ids: SeededIds  # a seed's run id: seeded_ids(seed), from its identity(cfg, seed=False)
    label_parts: tuple[str, str]  # its label around the seed: a seed's label is seeded_label(parts, seed)
    stage_folder: Path


@dataclass(frozen=True)
class Run:
    """One run of a stage: its grid point (paper numbers), what run_job receives, and who it is."""

    params: dict[str, Any]
    overrides: list[str]
    config: Configuration
    seed: int
    run_id: str
    label: str
    run_dir: Path
    actual: dict[str, Any] = field(default_factory=dict)  # params this scale changes: their values at this scale


def distribution(values: Sequence[Any]) -> BaseDistribution:
    """The Optuna distribution recording a grid axis (numeric ranges may change between launches)."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return IntDistribution(min(values), max(values))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return FloatDistribution(min(values), max(values))
    return CategoricalDistribution(list(values))


class Stage:
    """A stage with the command line applied: its grid axes or search space, and its runs."""

    @long_lived()  # its configurations and runs last as long as it does
    def __init__(self, arguments: Sequence[str]) -> None:
        parsed = parse_overrides(arguments)  # once: sorted twice, before and after the stage's axes are known
        first = split_arguments(parsed, ())
        if first.stage is None:
            names = sorted({path.stem for path in stage_paths(config_dirs())})
            raise ConfigError(f"name a stage: stage=<name>, one of {names}")
        self.compose = Composer()  # a run's config, as its own process would compose it (group choices cached)
        self._configurations: dict[tuple[str, ...], Configuration] = {}
        # a configuration's first run, and where its seed is in its overrides: its other seeds are named from it
        self._first_seeds: dict[tuple[Any, ...], tuple[Run, int]] = {}
        self.screened: list[Screened] = []  # stage.select=zoom: each width's promotion, with why (plan, the record)
        self._zoomed: dict[str, list[Any]] = {}  # stage.select=zoom: the values its candidates take on each axis
        self.base = self.compose(first.base)
        check_interpolations(self.base)  # whole, once: a run differs from it only in its axes (checked per run)
        self.spec = self.base.stage
        self.select = self.spec.select  # read per run: a DictConfig lookup is not free
        self.name: str = check_stage_name(self.spec.name)
        check_claim(self.name, first.stage, self.spec.role)  # its role, no other stage's: before anything else
        given = any(o.key_or_group == "sweep.metric" for o in parsed)
        objectives.settle(self.base.sweep, self.name, given)  # sweep.metrics: its first is the ranking metric
        self.sweep_dir = Path(self.base.paths.runs) / self.name
        self.args: Arguments = split_arguments(parsed, list(self.spec.grid))
        self.rule = for_stage(self)  # what decides the runs it adds (cart_sweeps.rules): chosen once
        grid = self.rule.grid(cast(dict[str, list[Any]], OmegaConf.to_container(self.spec.grid, resolve=True)))
        sizes = {**{k: len(v) for k, v in grid.items()}, **self.args.sizes}
        if self.spec.variants:
            sizes[VARIANT] = len(self.spec.variants)
        searching = self.base.sweep.sampler != Sampler.grid
        if not searching:  # counted before any axis is listed: the axes zoom selects from are counted as it selects
            self._check_size({k: n for k, n in sizes.items() if self.select != "zoom" or k not in ZOOM_AXES})
        self._scale = cast(ScaleConfig, OmegaConf.to_object(self.base.scale))  # read per run: a dataclass is fast
        self.train = StageKind(self.spec.kind).trains
        self.option = first.stage  # the stage file (its `name:` may differ: the ad-hoc stage, stage.name=...)
        self._paper = self.compose([f"stage={format_value(first.stage)}", "scale=paper"])
        self._paper_values: dict[str, Any] = {}
        self._own = self.spec.numbers == StageNumbers.own  # the stage's numbers are the run's scale's: as written
        recipe = cast(dict[str, Any], OmegaConf.to_container(self.spec.recipe, resolve=True))
        self.recipe = {k: self._as_paper(k, v) for k, v in recipe.items()}  # the paper's numbers (as the grid's)
        typed: dict[str, list[Any]] = {
            k: [self._as_paper(k, v) for v in vs] for k, vs in {**grid, **self.args.axes}.items()
        }
        if not self._own:
            check_apart(self.name, typed, self.recipe, self._scale, self._paper_value, self.train)
        self.axes: dict[str, list[Any]] = {k: [axis_value(v) for v in vs] for k, vs in typed.items()}  # as params hold
        self._typed = {(k, axis_value(v)): v for k, vs in typed.items() for v in vs}  # a param's value -> the value
        self._interpolating = [k for k in self.args.axes if "${" in repr(typed[k])]  # resolved per run
        if self.spec.variants:
            self.axes[VARIANT] = list(self.spec.variants)
        self.space = space.parse(cast(dict[str, Any], OmegaConf.to_container(self.spec.search, resolve=True)))
        self.search = self.space.dists
        self.varied = varied_keys(self.axes, list(self.search), self.spec.variants)
        if searching:
            self._check_search()
            self.runs: list[Run] = []
            self._check_search_ends()
        else:  # grid (sweep.sampler is a Sampler: compose refuses anything else)
            if self.search and not self.spec.grid:
                raise ConfigError(
                    f"stage {self.name} is a search: add sweep.sampler=tpe sweep.n_trials=N (or another sampler: "
                    f"{'|'.join(samplers.SEARCH)})"
                )
            self.runs = self._grid_runs()
        self.rule.check()

    def _as_paper(self, key: str, value: Any) -> Any:
        """A stage's value in the paper's numbers (a width the scale shows read back), or as written where the
        stage's numbers are the run's own (stage.numbers: own)."""
        return value if self._own else to_paper(key, value, self._scale)

    def _check_search(self) -> None:
        """Refuse, in one line, a search its sampler cannot run: no space or no n_trials, a grid beside it (a
        search runs the points it samples, never a grid's), a space its sampler cannot sample (sweep/samplers.py)."""
        sampler, n_trials = self.base.sweep.sampler, self.base.sweep.n_trials
        if not self.search or not n_trials or n_trials < 1:
            raise ConfigError(
                f"sweep.sampler={sampler} needs a stage with a search space and sweep.n_trials=N; stage {self.name} "
                + ("has none" if not self.search else "has one, so add sweep.n_trials (1 or more)")
            )
        if grid := [k for k in self.axes if k != VARIANT] + (["stage.variants"] if self.spec.variants else []):
            raise ConfigError(
                f"stage {self.name} is a search (sweep.sampler={sampler}): it samples stage.search, not a grid, so "
                f"{grid[0]} would take none of its values; give it one value (stage.recipe, or key=value), declare "
                f"it in stage.search ({{choices: [...]}}), or run the grid with sweep.sampler=grid"
            )
        samplers.check(sampler, self.space, objectives.objectives(self.base.sweep), self.name)
        self._check_size({"sweep.n_trials": n_trials})

    def seed(self) -> int:
        """The seed its runs take (the command line's, else its recipe's, else the config's): a search's sampler's."""
        recipe = self.spec.recipe.get("seed") if "seed" not in self.args.passed else None
        return int(recipe if isinstance(recipe, int) else self.base.seed)

    def _check_search_ends(self) -> None:
        """A search samples its runs as it goes: the runs at the ends of its space are composed and validated
        now, so a range its runs cannot take (a learning rate below trainer.min_lr) is one line before launch."""
        for corner in self.space.corners():
            self.run(corner)

    def known_runs(self, history: dict[str, list[FrozenTrial]]) -> list[Run]:
        """The grid's runs; for a search, the runs its trials so far sampled (from the ledger's history)."""
        if self.runs:
            return self.runs
        firsts = sorted((trials[0] for trials in history.values()), key=lambda t: t.number)
        return [self.run(t.params) for t in firsts]

    def dists(self, params: dict[str, Any]) -> dict[str, BaseDistribution]:
        """The distributions a trial at `params` records (the axis it came from, or the search space)."""
        return {
            k: self.search[k] if k in self.search else distribution(self._zoomed.get(k) or self.axes.get(k, [v]))
            for k, v in params.items()
        }

    def _check_size(self, sizes: dict[str, int]) -> None:
        """Refuse a stage of more runs than stage.max_runs, counted from what it multiplies (its axes' lengths, its
        variants, its candidates), before its runs are listed: one line naming them and the override that allows it."""
        runs = math.prod(sizes.values())
        if runs > self.spec.max_runs:
            factors = " x ".join(f"{n:,} {k}" for k, n in sizes.items())
            raise ConfigError(
                f"stage {self.name} has {runs:,} runs ({factors}), more than stage.max_runs={self.spec.max_runs:,}; "
                f"narrow it, or allow it with stage.max_runs={runs}"
            )

    def _points(self) -> Iterator[dict[str, Any]]:
        """The stage's grid points, one at a time: a stage keeps its runs, never a list of its whole product."""
        if self.select == "best":  # each width's best run of stage zoom_from, times the grid
            self._best = best_single_run(self._source(), self.base.sweep.metric)
            self._check_size({"best runs": len(self._best), **{k: len(v) for k, v in self.axes.items()}})
            d_key, r_key = ZOOM_AXES[:2]
            return (
                {d_key: d, "stage.eval_n_loops": b[r_key], **g}
                for d, b in self._best.items()
                for g in product(self.axes)
            )
        if self.select == "zoom":
            if not all(k in self.axes for k in ZOOM_AXES[:2]):
                raise ConfigError(f"stage.select=zoom needs a grid over {ZOOM_AXES[:2]}; stage {self.name} has none")
            source = self._source()
            confirm = self.recipe.get("trainer.steps", self._paper_value("trainer.steps"))
            allowed = drift_allowance(screen_steps(source), int(confirm), self.spec.drift)
            cands, self.screened = zoom_candidates(
                source, self.base.sweep.metric, self.axes[ZOOM_AXES[0]], self.spec.sentinels, allowance=allowed
            )
            self._zoomed = {k: sorted({c[k] for c in cands}) for k in ZOOM_AXES}  # what its trials record
            rest = {k: v for k, v in self.axes.items() if k not in ZOOM_AXES}
            self._check_size({"zoom candidates": len(cands), **{k: len(v) for k, v in rest.items()}})
            return ({**c, **g} for c in cands for g in product(rest))
        return filter(self.rule.first, product(self.axes))

    def _grid_runs(self) -> list[Run]:
        runs: dict[str, Run] = {}
        for point in self._points():
            run = self.run(point)
            if (same := runs.get(run.run_id)) is not None:
                raise ConfigError(f"stage {self.name}: {same.params} and {point} are the same run ({run.label})")
            runs[run.run_id] = run
        return list(runs.values())

    def objective(self) -> dict[str, Any]:
        """What this launch's ledger values mean: the sweep metric, and the recipe its runs share (the stage's
        recipe, its scale, and the command line's settings of what runs compute), less what the stage varies.
        A setting that restates the value its key has without it is no part of it: the same runs, the same study."""
        settings = {k: o for k, o in self.args.passed.items() if _defining_key(k) and k not in self.varied}
        if settings:  # composed once more, without them: what each key would be
            without = self.compose([line for line in self.args.base if line not in settings.values()])
            settings = {k: o for k, o in settings.items() if _value(self.base, k) != _value(without, k)}
        passed = sorted(self._setting(k, o) for k, o in settings.items())
        recipe = {k: v for k, v in self.recipe.items() if k not in self.varied}
        meant = {"metric": self.base.sweep.metric, **objectives.meaning(self.base.sweep)}
        return {**meant, "scale": self.base.scale.name, "recipe": recipe, "passed": passed}

    def _setting(self, key: str, line: str) -> str:
        """A command-line setting by its value, not its spelling (`trainer.lr=3e-3` and `0.003` alike read
        `trainer.lr=0.003`, as format_value writes it, and an interpolation its resolved value), so that one
        value is one objective; a group choice (model=dense) or a deletion as typed."""
        value = OmegaConf.select(self.base, key, default=line)  # `line` itself: no such value (data/tokenizer=...)
        if line.startswith("~") or value is line or OmegaConf.is_dict(value):
            return line
        plain = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_list(value) else value
        return f"{key}={format_value(plain)}"

    def _overrides(self, values: dict[str, Any]) -> list[str]:
        mine = [f"{k}={format_value(v)}" for k, v in values.items() if k not in self.args.passed]
        shown = [k for k in self.varied if k not in LABEL_SHOWS]
        tags = [f"stage.varied={format_value(shown)}"] if shown else []
        return [f"stage={format_value(self.option)}", *mine, *tags, *self.args.passed.values()]

    def _source(self) -> RunSet:
        """The runs of stage zoom_from that its conclusions use (as the analysis tables them), all done."""
        source = check_stage_name(self.spec.zoom_from, "stage.zoom_from")
        runs = stage_runs(Path(self.base.paths.runs), source, scale=self.base.scale.name)
        if not runs.used and not runs.pending:
            raise ConfigError(
                f"stage.select={self.spec.select} needs the results of stage {source}: run stage={source} first"
            )
        if runs.pending or runs.missing:
            first = runs.pending[0].label if runs.pending else runs.missing[0]
            raise ConfigError(
                f"stage.select={self.spec.select} reads stage {source}, which is not complete: "
                f"{len(runs.pending) + len(runs.missing)} of its runs have no result (first: {first}); "
                f"finish it first (python -m cart_sweeps stage={source} with its launch's settings)"
            )
        return runs

    def _paper_value(self, key: str) -> Any:
        """`key`'s value at scale=paper, read once: every run looks up the keys its scale changes."""
        if key not in self._paper_values:
            self._paper_values[key] = OmegaConf.select(self._paper, key)
        return self._paper_values[key]

    def run(self, params: dict[str, Any]) -> Run:
        """The run at a grid point or sampled point (paper numbers), composed and validated. The seeds of a
        configuration share everything but the seed: the first is worked out in full, the others named from it
        (a stage of 64 configurations x 160 seeds works 64 out, not 10,240)."""
        params = {k: axis_value(v) for k, v in params.items()}  # a ledger's list (an earlier version's) as text
        seed = params.get("seed")
        named_alike = isinstance(seed, int) and "seed" not in self.args.passed  # else the command line's seed wins
        first = self._first_seeds.get(_without_seed(params)) if named_alike else None
        if first is None:
            run = self._worked_out(params)
            if named_alike and self._configurations.get(_seedless(run.overrides)) is run.config:
                at = next(i for i, o in enumerate(run.overrides) if o.startswith("seed="))
                self._first_seeds[_without_seed(params)] = run, at  # its seeds share its config (_named)
            return run
        sibling, at = first
        overrides = [*sibling.overrides[:at], f"seed={seed}", *sibling.overrides[at + 1 :]]
        return make_run(params, overrides, sibling.config, seed, sibling.actual)

    def _worked_out(self, params: dict[str, Any]) -> Run:
        paper = dict(self.recipe)
        paper.update({k: self._typed.get((k, v), v) for k, v in params.items() if k != VARIANT})
        if VARIANT in params:
            paper.update(
                cast(dict[str, Any], OmegaConf.to_container(self.spec.variants[params[VARIANT]], resolve=True))
            )
        parity = paper.pop(PARITY, None)
        values = dict(paper) if self._own else to_scale(paper, self._scale, self._paper_value, self.train)
        stated = {k: paper[k] if k in paper else self._paper_value(k) for k in values}
        scaled = {k: v for k, v in stated.items() if v != values[k]}  # kept in the run's config as scale.paper
        if self.select == "best":  # the folder is no trial param (its value space changes between launches)
            values["stage.source"] = self._best[params[ZOOM_AXES[0]]]["run_dir"]
        if VARIANT in params:
            values["stage.variant"] = params[VARIANT]
        if parity is not None:
            cart = {k: v for k, v in values.items() if k not in ("model", "model.n_layers", "stage.variant")}
            values["model.n_layers"] = dense_parity(self.compose(self._overrides(cart)).model, parity)
        if scaled:
            values["++scale.paper"] = scaled  # ++: adds keys to the (empty) dict
        overrides = self._overrides(values)
        return replace(self._named(dict(params), overrides), actual={k: values[k] for k in params if k in scaled})

    def _named(self, params: dict[str, Any], overrides: list[str]) -> Run:
        """The run of `overrides`, composed once per configuration (its overrides less the seed) and each seed
        named from that; a config that reads the seed (an interpolation) or an evaluation is composed per run."""
        seed = _int_value(next((o for o in overrides if o.startswith("seed=")), None))
        key = _seedless(overrides)
        if seed is not None and (config := self._configurations.get(key)) is not None:
            return make_run(params, overrides, config, seed)
        cfg = self.compose(overrides)
        check_interpolations(cfg, self._interpolating)
        if not self.train:  # an evaluation is named by its source's groups, not those composed here
            return make_run(params, overrides, make_configuration(cfg))
        config = make_configuration(cfg, partial(self.compose.identity, overrides))
        if seed is not None and not self.compose.reads_seed(overrides):
            self._configurations[key] = config
        return make_run(params, overrides, config)


def product(axes: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    """Every point of the axes' product, one at a time."""
    return (dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values()))


def _seedless(overrides: list[str]) -> tuple[str, ...]:
    """A run's overrides less its seed: what its configuration is known by."""
    return tuple(o for o in overrides if not o.startswith("seed="))


def _without_seed(params: dict[str, Any]) -> tuple[Any, ...]:
    """A grid point less its seed, as a key (its values axis values: hashable)."""
    return tuple(item for item in params.items() if item[0] != "seed")


def _int_value(line: str | None) -> int | None:
    """The integer of `seed=<int>`; None for anything else (composing it then says what is wrong)."""
    try:
        return int(line.partition("=")[2]) if line is not None else None
    except ValueError:
        return None


def varied_keys(axes: dict[str, list[Any]], search: Sequence[str], variants: Any) -> tuple[str, ...]:
    """Every key a stage's runs differ in: its grid axes (command-line ones too), its search space, and each
    key its variants set (a derived parity depth is model.n_layers)."""
    keys = [k for k in axes if k != VARIANT] + list(search)
    for values in (variants or {}).values():
        keys += ["model.n_layers" if k == PARITY else k for k in values]
    return tuple(dict.fromkeys(keys))


def _value(cfg: DictConfig, key: str) -> Any:
    """A command-line key's value in `cfg`, resolved (a group's as its settings), or a marker where it has none."""
    value = OmegaConf.select(cfg, key.lstrip("+~"), default=_ABSENT)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


_ABSENT = object()


def _defining_key(key: str) -> bool:
    """Whether a command-line key changes what runs compute (model, data, trainer, seed; not where or how fast)."""
    group, _, name = key.lstrip("+~").partition(".")
    return (group in GROUPS or group == "seed") and name not in NON_IDENTITY_KEYS.get(group, ())


_SEEDLESS = partial(identity, seed=False)


def make_configuration(cfg: DictConfig, name: Callable[[DictConfig], dict[str, Any]] = _SEEDLESS) -> Configuration:
    """Validate a composed config and name its configuration; `name` gives its identity less the seed (a
    stage's composer memoizes it: hashing is not free)."""
    if StageKind.of(cfg).reads_checkpoint:
        cfg, name = with_source(cfg), _SEEDLESS  # its groups are the source's
    validate(cfg)
    config_identity = name(cfg)
    ids = SeededIds.of(config_identity)
    return Configuration(cfg, digest(config_identity), ids, label_parts(cfg), stage_folder(cfg))


def make_run(
    params: dict[str, Any],
    overrides: list[str],
    config: Configuration,
    seed: int | None = None,
    actual: dict[str, Any] | None = None,
) -> Run:
    """The run of `config` at `seed` (None: the seed it was composed at), in `<paths.runs>/<stage>/<label>-<id[:8]>`."""
    seed = config.cfg.seed if seed is None else seed
    id_, label = config.seeded_ids(seed), seeded_label(config.label_parts, seed)
    return Run(params, overrides, config, seed, id_, label, run_folder(config.stage_folder, label, id_), actual or {})
