"""The statistics the paper lacks: variance shares, the P-ordering check, and the
value of rho that weight decay alone predicts."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from scipy import stats

from cart_sweeps.config import CONF_DIR, ModelConfig, TrainerConfig
from cart_sweeps.schedule import Schedule

# The paper's recipe as the study states it (conf/trainer/paper.yaml), on its schema.
PAPER = OmegaConf.merge(OmegaConf.structured(TrainerConfig), OmegaConf.load(CONF_DIR / "trainer" / "paper.yaml"))


@dataclass(frozen=True)
class Recipe:
    """The parts of a run's trainer config that move the gate without any gradient."""

    steps: int
    lr: float = PAPER.lr
    min_lr: float = PAPER.min_lr
    warmup_steps: int = PAPER.warmup_steps
    weight_decay: float = PAPER.weight_decay
    decay_all: bool = PAPER.decay_all  # False: the gate is spared from weight decay, so it stays where it started
    schedule: str = PAPER.schedule  # the learning rate's fall (schedule.Schedule): cosine, or wsd with these two
    decay_fraction: float = PAPER.decay_fraction
    decay_shape: str = PAPER.decay_shape


def recipe_of(row: pd.Series) -> Recipe:
    """The recipe of the run a row belongs to: its trainer columns, or the paper recipe with
    steps = the row's step where the input carries no trainer config (a results CSV)."""
    given = {f.name: row[f.name] for f in fields(Recipe) if f.name in row and pd.notna(row[f.name])}
    given.setdefault("steps", row["step"])
    types: dict[str, Callable[[Any], Any]] = {"int": int, "bool": _flag, "str": str}  # the fields' annotations
    return Recipe(**{f.name: types.get(str(f.type), float)(given[f.name]) for f in fields(Recipe) if f.name in given})


def _flag(value: object) -> bool:
    """A boolean from JSON, pandas or CSV text ('True', 'false', 1)."""
    return bool(value) if isinstance(value, bool | np.bool_) else str(value).strip().lower() in {"true", "1", "yes"}


def lr_schedule(recipe: Recipe) -> np.ndarray:
    """The learning rate of each optimiser step t = 0..steps-1, by the schedule the runs trained with."""
    schedule = Schedule.of(recipe)
    return np.array([schedule.lr_at(t) for t in range(recipe.steps)], dtype=np.float64)


@lru_cache(maxsize=64)
def wd_only_rho(recipe: Recipe, rho0: float = ModelConfig.gate_init) -> np.ndarray:
    """sigmoid(a) after each of 0..steps steps when only AdamW's decoupled decay a <- a (1 - lr_t wd) acts: if
    the reported rho sits on this curve, the "learned" stability band is weight decay, not learning."""
    a0 = math.log(rho0 / (1 - rho0))
    wd = recipe.weight_decay if recipe.decay_all else 0.0
    a = a0 * np.concatenate([[1.0], np.cumprod(1 - lr_schedule(recipe) * wd)])
    return 1 / (1 + np.exp(-a))


def variance_shares(y: pd.Series, factors: pd.DataFrame, within: pd.Series | None = None) -> dict[str, float]:
    """Share of the variance of y explained by each factor's main effect (two-way additive, exact for a balanced
    grid; the residual is interaction and noise); `within` (the width) centres y per group first, so pooled
    shares measure effects common to all widths."""
    centred = y - (y.groupby(within).transform("mean") if within is not None else y.mean())
    total = float((centred**2).sum()) or math.nan  # all cells equal: nothing to explain
    shares = {f: float((centred.groupby(factors[f]).transform("mean") ** 2).sum()) / total for f in factors}
    shares["residual"] = 1 - sum(shares.values())
    return {k: round(v, 12) for k, v in shares.items()}  # no 1e-16 float dust in the tables


def ordering(values: pd.Series, levels: pd.Series) -> list:
    """The levels sorted by their value, lowest first (the best first, for rank values: analysis.load.rank_values)."""
    return list(levels.iloc[np.argsort(values.to_numpy(), kind="stable")])


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman rank correlation (NaN below 3 pairs, where a rank correlation means nothing)."""
    return float(stats.spearmanr(a, b).statistic) if len(a) >= 3 else math.nan
