"""A search stage's space (stage.search, docs/decisions.md): numeric ranges, categorical choices, and parameters
sampled only when another takes a given value (`when:`); each declaration checked in one line before anything
launches. A trial samples define-by-run, each conditional parameter after the categorical it names, so a run
without the condition has no value for the parameter: its stage's recipe holds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import Trial

from cart_sweeps.config import ConfigError

NUMERIC, CHOICES, WHEN = ("low", "high", "log"), "choices", "when"
Scalar = (str, int, float, bool)


@dataclass(frozen=True)
class Space:
    """The declared parameters (key -> its distribution, each after those its condition names) and their
    conditions (key -> {key: allowed values})."""

    dists: dict[str, BaseDistribution] = field(default_factory=dict)
    when: dict[str, dict[str, list[Any]]] = field(default_factory=dict)

    def active(self, key: str, params: Mapping[str, Any]) -> bool:
        """Whether `key` is sampled at `params` (the values sampled so far)."""
        return all(params.get(k) in allowed for k, allowed in self.when.get(key, {}).items())

    def sample(self, trial: Trial) -> dict[str, Any]:
        """A trial's params: each parameter its conditions allow, suggested in declaration order."""
        out: dict[str, Any] = {}
        for key, dist in self.dists.items():
            if self.active(key, out):
                out[key] = suggest(trial, key, dist)
        return out

    def corners(self) -> Iterator[dict[str, Any]]:
        """Every combination of each parameter's ends (a range's low and high, every choice), less what a
        condition leaves out: the runs composed and validated before a search launches."""
        ends = [_ends(d) for d in self.dists.values()]
        seen = set()
        for values in itertools.product(*ends):
            point = dict(zip(self.dists, values, strict=True))
            kept = {k: v for k, v in point.items() if self.active(k, point)}
            if (key := repr(kept)) not in seen:
                seen.add(key)
                yield kept

    def holds(self, params: Mapping[str, Any]) -> bool:
        """Whether `params` is a point of this space: each parameter its conditions allow, each within its range or
        among its choices (a trial of a launch with another space may not be)."""
        if set(params) != {k for k in self.dists if self.active(k, params)}:
            return False
        return all(_within(self.dists[k], v) for k, v in params.items())

    def size(self) -> int | None:
        """How many distinct points the space holds (a parameter a condition leaves out adds none); None where
        a float range spans more than one value."""
        counts = {key: _count(dist) for key, dist in self.dists.items()}
        if None in counts.values():
            return None
        named = sorted({k for condition in self.when.values() for k in condition})  # the categoricals conditions name
        total = 0
        for values in itertools.product(*(_ends(self.dists[k]) for k in named)):
            chosen = dict(zip(named, values, strict=True))
            total += math.prod(n for k, n in counts.items() if k not in chosen and self.active(k, chosen) and n)
        return total


def point(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A sampled point as a key: the same params (in any order, a value as Optuna gives it back) are one point."""
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def _within(dist: BaseDistribution, value: Any) -> bool:
    if isinstance(dist, CategoricalDistribution):
        return any(type(value) is type(c) and value == c for c in dist.choices)
    assert isinstance(dist, IntDistribution | FloatDistribution)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and dist.low <= value <= dist.high and (isinstance(value, int) or isinstance(dist, FloatDistribution))


def _count(dist: BaseDistribution) -> int | None:
    if isinstance(dist, IntDistribution):
        return dist.high - dist.low + 1
    if isinstance(dist, FloatDistribution):
        return 1 if dist.low == dist.high else None
    assert isinstance(dist, CategoricalDistribution)
    return len(dist.choices)


def suggest(trial: Trial, key: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(key, dist.low, dist.high, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(key, dist.low, dist.high, log=dist.log)
    assert isinstance(dist, CategoricalDistribution)
    return trial.suggest_categorical(key, list(dist.choices))


def _ends(dist: BaseDistribution) -> list[Any]:
    if isinstance(dist, IntDistribution | FloatDistribution):
        return [dist.low, dist.high]
    assert isinstance(dist, CategoricalDistribution)
    return list(dist.choices)


def parse(search: Mapping[str, Any]) -> Space:
    """stage.search as a Space, or one line naming the first declaration that is not one (and the forms)."""
    dists = {key: _distribution(key, spec) for key, spec in search.items()}
    when = {key: _condition(key, spec[WHEN], search, dists) for key, spec in search.items() if WHEN in spec}
    return Space(_drawn_in_order(dists, when), when)


def _drawn_in_order(
    dists: dict[str, BaseDistribution], when: Mapping[str, Mapping[str, Any]]
) -> dict[str, BaseDistribution]:
    """The parameters in the order a trial draws them: as declared, but each conditional one after every
    parameter its condition names (a trial knows whether `model.n_loops: {when: {model: cart}}` applies only once
    it has drawn `model`, wherever the file declares it)."""
    ordered: dict[str, BaseDistribution] = {}
    waiting: list[str] = []  # declared above a parameter its condition names
    for key in dists:  # a condition names unconditional parameters only (_condition): each is placed as declared
        waiting.append(key)
        while ready := next((k for k in waiting if all(n in ordered for n in when.get(k, {}))), None):
            ordered[ready] = dists[ready]
            waiting.remove(ready)
    return ordered


def _forms(key: str) -> str:
    return f"write stage.search.{key}: {{low: 1, high: 8}} (log: true for a log scale), or {{choices: [a, b]}}"


def _distribution(key: str, spec: Any) -> BaseDistribution:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"stage.search.{key}: {spec!r} is not a range or a list of choices; {_forms(key)}")
    unknown = sorted(set(spec) - {*NUMERIC, CHOICES, WHEN})
    if unknown:
        raise ConfigError(f"stage.search.{key}: unknown field {unknown[0]!r}; {_forms(key)} (when: {{key: value}})")
    if CHOICES in spec:
        choices = spec[CHOICES]
        if set(spec) & set(NUMERIC):
            raise ConfigError(f"stage.search.{key}: choices and a range both given; {_forms(key)}")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, Scalar) for c in choices):
            raise ConfigError(f"stage.search.{key}.choices: give a list of two or more values, e.g. [cart, dense]")
        if len(set(map(repr, choices))) < len(choices):
            raise ConfigError(f"stage.search.{key}.choices: {choices} names a choice twice")
        return CategoricalDistribution(choices)
    try:
        low, high, log = spec["low"], spec["high"], bool(spec.get("log", False))
    except KeyError as err:
        raise ConfigError(f"stage.search.{key} needs low and high (and optionally log); {_forms(key)}") from err
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)) or not low <= high:
        raise ConfigError(f"stage.search.{key}: low={low!r} and high={high!r} must be numbers with low <= high")
    if log and low <= 0:
        raise ConfigError(f"stage.search.{key}: a log range needs low > 0 (it has low={low})")
    if isinstance(low, int) and isinstance(high, int):
        return IntDistribution(low, high, log=log)
    return FloatDistribution(float(low), float(high), log=log)


def _condition(
    key: str, spec: Any, search: Mapping[str, Any], dists: Mapping[str, BaseDistribution]
) -> dict[str, list[Any]]:
    """`when: {other: value}` (or a list of values), `other` an unconditional categorical parameter."""
    if not isinstance(spec, Mapping) or not spec:
        raise ConfigError(f"stage.search.{key}.when: give {{parameter: value}}, e.g. when: {{model: cart}}")
    out = {}
    for other, value in spec.items():
        dist = dists.get(other)
        if not isinstance(dist, CategoricalDistribution) or other == key or WHEN in search[other]:
            have = [k for k, d in dists.items() if isinstance(d, CategoricalDistribution) and WHEN not in search[k]]
            raise ConfigError(
                f"stage.search.{key}.when: {other} is not an unconditional categorical parameter of the search "
                f"(have: {', '.join(have) or 'none'}; declare it as {other}: {{choices: [...]}})"
            )
        allowed = value if isinstance(value, list) else [value]
        if bad := [v for v in allowed if v not in dist.choices]:
            raise ConfigError(
                f"stage.search.{key}.when: {other}={bad[0]} is not one of its choices {list(dist.choices)}"
            )
        out[other] = allowed
    return out
