"""The ladder's decisions from values alone, through one entry point, `walk`: what a ladder stage acts on and the
simulator tests (docs/ladder.md). DRIFT_PRIOR errs towards keeping: the paper's two stages also differ in
sequence length and batch, and Stage 1 is one seed, so part of each change it measures is recipe and noise."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from cart_sweeps.metric import Metric
from cart_sweeps.rules.decide import Noise, Option, options, pool, seeds_in_every, settle, tested_margin
from cart_sweeps.schedule import stable_steps

# (R=6, R=8) PPL_wiki at P=6: Stage 1 at 3,000 steps, Stage 2 at 30,500 (REFERENCE.md section 5)
PAPER_R6_R8 = {
    256: ((184.9, 186.2), (41.165, 40.311)),
    512: ((137.4, 136.4), (27.097, 27.203)),
    768: ((116.0, 115.0), (22.850, 22.863)),
    1024: ((98.75, 97.73), (20.354, 20.402)),
}
PAPER_HORIZONS = (3000, 30500)

RECORD = "ladder"  # the ledger study's user attribute: the ladder's records (rules/ladder.py writes them)
RECORD_FILE = "ladder.json"  # the same, with the design, in the stage folder


def paper_rate() -> float:
    """The root mean square, per unit of ln(horizon), of how far each width's R=8 - R=6 log gap moved from
    3,000 to 30,500 steps in the paper."""
    changes = [math.log(two[1] / two[0]) - math.log(one[1] / one[0]) for one, two in PAPER_R6_R8.values()]
    return math.sqrt(sum(c * c for c in changes) / len(changes)) / math.log(PAPER_HORIZONS[1] / PAPER_HORIZONS[0])


DRIFT_PRIOR = round(paper_rate(), 4)


def name(config: Any) -> str:
    """A configuration as text: a cell's `n_loops=8 n_prelude=6`, else its repr."""
    if config == ():
        return "the one configuration"
    if isinstance(config, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in config):
        return " ".join(f"{str(k).rsplit('.', 1)[-1]}={v}" for k, v in config)
    return str(config)


def group_name(group: Any) -> str:
    """A decision group as text: its width (`d_model=256`), else the stage."""
    return "the stage" if group is None else f"d_model={group}"


@dataclass(frozen=True)
class Judged:
    """One group at one rung: the best, each other option's adjusted p of its claim, the dropped and equivalent,
    and whether it is open (an option neither best, dropped nor equivalent)."""

    best: Any
    options: list[Option]  # best first
    p: dict[Any, float]  # config -> adjusted p (1 where untested)
    dropped: list[Any]
    kept: list[Any]  # best first
    noise: Noise | None
    allowance: float
    level: float  # alpha / looks
    equivalent: list[Any] = field(default_factory=list)  # kept, and decided within the margin of the best
    margin: float = 0.0  # the equivalence margin on the tested scale (0: none)
    said_within: list[Any] = field(default_factory=list)  # undecided or equivalent: p is the equivalence claim's

    @property
    def open(self) -> bool:
        return len(self.kept) > 1 + len(self.equivalent)


def judge(
    values: Mapping[Any, Sequence[float]],
    metric: Metric,
    allowance: float,
    alpha: float,
    looks: int,
    noise: Noise | None = None,
    equivalence: float | None = None,
) -> Judged:
    """The rung's decision over each configuration's seed values (rules/decide.settle, beyond `allowance`);
    `noise`: the rung's, pooled over every group (None: this group's own)."""
    opts = options(values, metric)
    noise = noise or pool(opts, "the group's seeds")
    level = alpha / looks
    keep_all = Judged(opts[0].level if opts else None, opts, {}, [], [o.level for o in opts], noise, allowance, level)
    if len(opts) < 2 or len(opts) < len(values) or noise is None or not noise.measurable:
        return keep_all
    margin = None if equivalence is None else tested_margin(equivalence, metric, opts[0])
    found = settle(opts, noise, allowance, margin)
    p = {o.level: float(a) for o, a in zip(opts[1:], found.adjusted, strict=True)}
    within = dict(zip(p, found.within, strict=True))
    dropped = [c for c, a in p.items() if a <= level and not within[c]]
    equivalent = [c for c, a in p.items() if a <= level and within[c]]
    kept = [o.level for o in opts if o.level not in dropped]
    said_within = [c for c in p if within[c]]
    return Judged(
        opts[0].level, opts, p, dropped, kept, noise, allowance, level, equivalent, margin or 0.0, said_within
    )


@dataclass(frozen=True)
class Drift:
    """The rate a gap may close per unit of ln(horizon), and where it comes from."""

    rate: float
    source: str  # "prior" or "measured"
    closures: tuple[float, ...] = ()  # measured: each gap's change per unit of ln(horizon)
    interval: tuple[float, float] | None = None  # measured: 90% interval of the root-mean-square rate


def measured_rate(closures: Sequence[float], noise: Sequence[float]) -> Drift:
    """The root mean square of the true changes (`closures` less the variance seed noise owes each, `noise`): its
    90% chi-square interval, and as the rate the interval's upper end."""
    from scipy import stats

    n, total, own = len(closures), float(sum(c * c for c in closures)), float(np.mean(noise))
    low, high = (math.sqrt(max(0.0, total / stats.chi2.ppf(q, n) - own)) for q in (0.95, 0.05))
    return Drift(high, "measured", tuple(closures), (low, high))


@dataclass(frozen=True)
class Design:
    """A ladder: its horizons, seeds in order, the grid's seed count and the most, metric, prior drift, alpha."""

    rungs: tuple[int, ...]
    seeds: tuple[int, ...]
    first: int
    most: int
    metric: Metric
    prior: float = DRIFT_PRIOR
    alpha: float = 0.05
    branch: float | None = None  # stage.branch: the WSD decay fraction (None: every run is fresh)
    equivalence: float | None = None  # stage.equivalence: the relative margin (None: no equivalence decided)

    @property
    def looks(self) -> int:
        return len(self.rungs) * (self.most - self.first + 1)

    def steps(self, k: int, branched: bool) -> int:
        """The steps a run at rung k trains: its horizon, or branched, what follows the previous rung's stable phase."""
        if not (branched and k and self.branch is not None):
            return self.rungs[k]
        return self.rungs[k] - stable_steps(self.rungs[k - 1], self.branch)

    def allowance(self, k: int, drift: Drift) -> float:
        return drift.rate * math.log(self.rungs[-1] / self.rungs[k])


@dataclass(frozen=True)
class Want:
    """A run the ladder asks for now: rung index, group, configuration, seed, and why."""

    rung: int
    group: Any
    config: Any
    seed: int
    why: str


@dataclass(frozen=True)
class Call:
    """A record of the ladder: what became of a configuration at a rung, and why."""

    rung: int
    horizon: int
    group: Any
    config: Any
    action: str  # promoted | dropped | decided | undecided | stopped
    reason: str


@dataclass
class Walk:
    """Where the ladder stands: the runs it wants now, its records, each group's end, and each rung's drift."""

    wants: list[Want] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    ended: dict[Any, tuple[int, Judged]] = field(default_factory=dict)
    judged: dict[tuple[int, Any], Judged] = field(default_factory=dict)
    drift: dict[int, Drift] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return not self.wants


Data = Mapping[tuple[int, Any, Any], Mapping[int, float]]  # (rung, group, config) -> seed -> value


@dataclass(frozen=True)
class Gap:
    """A configuration's gap to its group's best at the later of two rungs, at both, among those run at both."""

    rung: int  # the earlier rung
    group: Any
    config: Any
    against: Any  # the later rung's best
    before: float
    after: float
    span: float  # ln(later horizon / earlier)
    shared: tuple[Any, ...]

    @property
    def closed(self) -> float:
        """How far the gap closed per unit of ln(horizon)."""
        return (self.before - self.after) / self.span


def gaps(
    rungs: Sequence[int], members: Sequence[Mapping[Any, Sequence[Any]]], score: Callable[[int, Any, Any], float]
) -> list[Gap]:
    """Each gap between consecutive rungs of `members` (per rung: group -> configurations), by `score(rung, group,
    config)`: the ladder's drift and the analysis's drift table alike."""
    out = []
    for j in range(len(members) - 1):
        span = math.log(rungs[j + 1] / rungs[j])
        for group, later in members[j + 1].items():
            shared = tuple(c for c in later if c in members[j].get(group, []))
            if len(shared) < 2:
                continue
            ref = min(shared, key=lambda c: score(j + 1, group, c))
            for c in shared:
                if c != ref:
                    before = score(j, group, c) - score(j, group, ref)
                    after = score(j + 1, group, c) - score(j + 1, group, ref)
                    out.append(Gap(j, group, c, ref, before, after, span, shared))
    return out


def _drift(design: Design, k: int, members: Mapping[int, Mapping[Any, list[Any]]], data: Data) -> Drift:
    """The drift rate rung k uses: the prior at the first rung, else measured on the grid's seeds up to rung k."""
    if k == 0:
        return Drift(design.prior, "prior")
    n, seeds = design.first, design.seeds[: design.first]

    @cache
    def scores(r: int, group: Any, c: Any) -> list[float]:
        return [design.metric.scaled(data[(r, group, c)][s]) for s in seeds]

    @cache
    def var(r: int, group: Any, shared: tuple[Any, ...]) -> float:
        return float(np.mean([np.var(scores(r, group, c), ddof=1) for c in shared])) if n > 1 else 0.0

    found = gaps(design.rungs, [members[j] for j in range(k + 1)], lambda *key: float(np.mean(scores(*key))))
    noise = [2 * (var(g.rung, g.group, g.shared) + var(g.rung + 1, g.group, g.shared)) / n / g.span**2 for g in found]
    return measured_rate([g.closed for g in found], noise) if found else Drift(design.prior, "prior")


def walk(design: Design, groups: Mapping[Any, Sequence[Any]], data: Data) -> Walk:
    """The ladder over `groups` on the values so far: the same data, the same walk (a relaunch's)."""
    out = Walk()
    members: dict[int, dict[Any, list[Any]]] = {0: {g: list(cs) for g, cs in groups.items()}}
    last = len(design.rungs) - 1
    for k, horizon in enumerate(design.rungs):
        live = {g: m for g, m in members[k].items() if g not in out.ended}
        if not live:
            break
        out.wants += _grid_seeds(design, k, live, data, "grid seed")
        if out.wants:
            return out
        drift = out.drift[k] = _drift(design, k, members, data)
        allowance = design.allowance(k, drift)
        members[k + 1] = {}
        seeding = []
        every = {g: seeds_in_every(design.seeds, [data[(k, g, c)] for c in m]) for g, m in live.items()}
        values = {g: {c: [data[(k, g, c)][s] for s in design.seeds[: every[g]]] for c in m} for g, m in live.items()}
        noise = pool([o for v in values.values() for o in options(v, design.metric)], f"rung {k + 1}'s seeds")
        for g, m in live.items():
            have = every[g]
            j = judge(values[g], design.metric, allowance, design.alpha, design.looks, noise, design.equivalence)
            out.judged[(k, g)] = j
            if j.open and have < design.most:
                why = f"rung {k + 1} ({horizon} steps): {group_name(g)} open with {have} seeds ({_open(j)})"
                seeding += [Want(k, g, c, design.seeds[have], f"{why}; seed {design.seeds[have]} added") for c in m]
                continue
            out.calls += _calls(k, horizon, g, j, k == last, drift)
            if k == last or not j.open:
                out.ended[g] = (k, j)
            else:
                members[k + 1][g] = list(j.kept)
        promoted = _grid_seeds(design, k + 1, members[k + 1], data, f"promoted from rung {k + 1}") if k < last else []
        if seeding:
            out.wants += seeding + promoted
            return out
    return out


def _grid_seeds(design: Design, k: int, groups: Mapping[Any, Sequence[Any]], data: Data, why: str) -> list[Want]:
    """The grid's seeds rung k lacks of each configuration in `groups`."""
    lacking = [(g, c, s) for g, m in groups.items() for c in m for s in design.seeds[: design.first]]
    where = f"rung {k + 1} ({design.rungs[k]} steps)"
    return [Want(k, g, c, s, f"{where}: {why}") for g, c, s in lacking if s not in data.get((k, g, c), {})]


def _open(j: Judged) -> str:
    if j.noise is None or not j.noise.measurable:
        return "no seed spread"
    return f"{name(j.best)} not told from {', '.join(name(c) for c in j.kept[1:])}"


def _calls(k: int, horizon: int, group: Any, j: Judged, final: bool, drift: Drift) -> list[Call]:
    """The records of one group's settled rung."""
    where = f"at {horizon} steps, {group_name(group)}"
    if j.noise is None or not j.noise.measurable:
        basis = "no measurable seed spread: nothing dropped"
    else:
        basis = (
            f"alpha/looks {j.level:.4g}, drift allowance {j.allowance:.2%} ({drift.source} rate "
            f"{drift.rate:.2%} per ln-horizon), seed s.d. {j.noise.sd:.2%}"
        )
    best = j.options[0] if j.options else None
    out = []
    for o in j.options:
        c = o.level
        worse = f"{o.score_mean - best.score_mean:.2%} worse than {name(j.best)}" if best is not None else ""
        if c == j.best:
            if final or not j.open:
                action = "decided" if len(j.kept) == 1 else "equivalent" if not j.open else "undecided"
                others = ", ".join(name(c) for c in j.kept[1:])
                text = {
                    "decided": "every other option dropped",
                    "equivalent": f"best, equivalent within {j.margin:.2%} to {others}",
                    "undecided": f"best, not told from {others}",
                }[action]
            else:
                action, text = "promoted", "the rung's best"
        elif c in j.dropped:
            action, text = "dropped", f"{worse} by more than the allowance, p={j.p[c]:.3g}"
        elif c in j.equivalent:
            action = "equivalent"
            text = f"{worse}, within {j.margin:.2%} of it beyond the allowance, p={j.p[c]:.3g}"
        else:
            p = j.p.get(c)
            action = "undecided" if final else "promoted"
            claim = "equivalence" if c in j.said_within else "drop"  # the pair's smaller-p claim (decide.settle)
            text = f"{worse}, not beyond the allowance" + (f" ({claim} claim's p={p:.3g})" if p is not None else "")
        out.append(Call(k, horizon, group, c, action, f"{where}: {name(c)} {text}; {basis}"))
    return out
