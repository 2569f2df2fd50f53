"""The sampler a search stage draws its trials with (`sweep.sampler`): one of Optuna's, by name, seeded by the
stage's seed, and a space it cannot sample as such refused in one line before anything launches (REFUSED; the
table in docs/decisions.md). Optuna itself refuses nothing: it samples what its sampler cannot handle at random,
saying so only in a log warning, so a "CMA-ES search" over a categorical choice would draw that choice at random.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution

from cart_sweeps.config import ConfigError
from cart_sweeps.options import Sampler
from cart_sweeps.sweep.space import Space

SEARCH = tuple(s for s in Sampler if s != Sampler.grid)  # the samplers of a search stage
CATEGORICAL, CONDITIONAL, SEVERAL = "a categorical parameter", "a conditional parameter", "several objectives"
REFUSED: dict[Sampler, tuple[str, ...]] = {
    Sampler.cmaes: (CATEGORICAL, CONDITIONAL, SEVERAL),
    Sampler.gp: (CONDITIONAL,),
    Sampler.nsga2: (CONDITIONAL,),
    Sampler.qmc: (CONDITIONAL,),
}
LEARNS = (Sampler.tpe, Sampler.gp, Sampler.cmaes, Sampler.nsga2)  # sample at random for sweep.startup_trials first

_BUILD: dict[Sampler, Callable[[int, int], optuna.samplers.BaseSampler]] = {
    Sampler.tpe: lambda seed, startup: optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup),
    Sampler.random: lambda seed, startup: optuna.samplers.RandomSampler(seed=seed),
    Sampler.gp: lambda seed, startup: optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup),
    Sampler.cmaes: lambda seed, startup: optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=startup),
    Sampler.nsga2: lambda seed, startup: optuna.samplers.NSGAIISampler(seed=seed, population_size=max(2, startup)),
    Sampler.qmc: lambda seed, startup: optuna.samplers.QMCSampler(seed=seed, scramble=True),  # scrambled: seeded
}


def make_sampler(sampler: Sampler, seed: int, startup_trials: int) -> optuna.samplers.BaseSampler:
    """The study's sampler, seeded by the stage's seed (a grid's trials have fixed params: TPE, unused there)."""
    with warnings.catch_warnings():  # QMCSampler is marked experimental (optuna 5.1): a line a user can do nothing of
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _BUILD.get(sampler, _BUILD[Sampler.tpe])(seed, startup_trials)


def check(sampler: Sampler, space: Space, objectives: Sequence[str], stage: str) -> None:
    """Refuse, in one line, a search `sampler` cannot sample as its space declares it."""
    refused = REFUSED.get(sampler, ())
    found: dict[str, Any] = {
        CATEGORICAL: next((k for k, d in space.dists.items() if isinstance(d, CategoricalDistribution)), None),
        CONDITIONAL: next(iter(space.when), None),
        SEVERAL: ",".join(objectives) if len(objectives) > 1 else None,
    }
    what = next((w for w in refused if found[w] is not None), None)
    if what is None:
        return
    able = ", ".join(s for s in SEARCH if what not in REFUSED.get(s, ()))
    where = f"sweep.metrics=[{found[what]}]" if what == SEVERAL else f"stage.search.{found[what]}"
    raise ConfigError(
        f"sweep.sampler={sampler} cannot sample {what} ({where}, stage {stage}): Optuna would draw it at random; "
        f"use sweep.sampler={able.replace(', ', '|')}, or change the space"
    )
