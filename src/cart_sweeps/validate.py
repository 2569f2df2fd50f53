"""Value checks the schema's types cannot express, on a composed config: one clear line (ConfigError) each."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError

from cart_sweeps.config import ConfigError, ModelConfig
from cart_sweeps.modelspec import spec_of
from cart_sweeps.options import StageKind
from cart_sweeps.schedule import schedule_problem


def check_bounds(node: Any, path: str) -> None:
    """The bounds the schema declares on a group's fields (`at_least`, `above`): one line for the first value that
    cannot succeed. A bounded value must be finite too (nan compares false both ways), unless its field
    declares infinity meaningful (trainer.grad_clip=inf clips nothing)."""
    schema = type(node) if is_dataclass(node) else OmegaConf.get_type(node)
    if schema is None or not is_dataclass(schema):
        return
    for f in fields(schema):
        value = getattr(node, f.name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        meant = math.isfinite(value) or (value == math.inf and f.metadata.get("infinite", False))
        also = "" if meant else " and finite"
        if (low := f.metadata.get("at_least")) is not None and not (value >= low and meant):
            raise ConfigError(f"{path}.{f.name}={value} must be >= {low:g}{also}")
        if (low := f.metadata.get("above")) is not None and not (value > low and meant):
            raise ConfigError(f"{path}.{f.name}={value} must be > {low:g}{also}")


def validate_model(m: DictConfig | ModelConfig) -> None:
    """Value checks on a model config, one clear line per problem: those every model shares, then its spec's."""
    spec = spec_of(m)
    check_bounds(m, "model")
    if m.d_model % m.head_dim:
        raise ConfigError(f"model.d_model={m.d_model} must be a positive multiple of model.head_dim={m.head_dim}")
    if m.head_dim % 2:
        raise ConfigError(f"model.head_dim={m.head_dim} must be even (RoPE rotates half of each head)")
    spec.check(m)


def _unknown_key(node: DictConfig, path: str) -> str | None:
    """The first key under `node` that its schema lacks, at any depth (`+` adds keys past a schema)."""
    schema = OmegaConf.get_type(node)
    if schema is None or not is_dataclass(schema):
        return None
    known = {f.name for f in fields(schema)}
    for key, child in node.items_ex(resolve=False):  # unresolved: this runs for every run of a stage
        if str(key) not in known:
            return f"{path}.{key!s}"
        if isinstance(child, DictConfig) and (found := _unknown_key(child, f"{path}.{key!s}")):
            return found
    return None


def check_settings(cfg: DictConfig) -> None:
    """A setting the schema lacks (`+model.n_loop=4`: a typo + let in), or a model no spec registers, is one line."""
    spec_of(cfg.model)
    for group in ("model", "data", "trainer"):
        if unknown := _unknown_key(cfg[group], group):
            parent, _, name = unknown.rpartition(".")
            known = [str(k) for k in cast(DictConfig, OmegaConf.select(cfg, parent)).keys() if k != name]
            close = difflib.get_close_matches(name, known, n=1)
            advice = f"did you mean {parent}.{close[0]}?" if close else "check its spelling (no + to set one)"
            raise ConfigError(f"+{unknown}: {parent} has no such setting; {advice}")


_NO_VARIABLE = re.compile(r"Environment variable '([^']*)' not found")


def check_interpolations(cfg: DictConfig, keys: Sequence[str] | None = None) -> None:
    """Every interpolation in `cfg` (or under its `keys`) resolves: one that does not (an unset ${oc.env:X}) is one
    line naming its key and why, not a traceback in a run after launch."""
    try:
        for node in [cfg] if keys is None else [OmegaConf.select(cfg, key) for key in keys]:
            if OmegaConf.is_config(node):
                OmegaConf.to_container(node, resolve=True)
    except (InterpolationResolutionError, GrammarParseError) as err:
        why = str(err).splitlines()[0]
        if unset := _NO_VARIABLE.search(why):
            name = unset.group(1)
            why = f"the environment variable {name} is not set (set it, or give a default: ${{oc.env:{name},VALUE}})"
        raise ConfigError(f"{err.full_key}: {why}") from err


def check_schedule(t: DictConfig) -> None:
    """The trainer's values against one another, where a combination cannot succeed or would train another schedule."""
    if t.min_lr > t.lr:
        raise ConfigError(
            f"trainer.min_lr={t.min_lr} must be <= trainer.lr={t.lr}: the cosine decays from lr to min_lr "
            "(above it, the learning rate would rise after the warm-up); lower trainer.min_lr"
        )
    if t.warmup_steps > 1 and t.warmup_steps >= t.steps:  # one warm-up step is none: its first step is at lr
        raise ConfigError(
            f"trainer.warmup_steps={t.warmup_steps} must be < trainer.steps={t.steps}: a warm-up must end "
            "before the run does (it would never decay, or never reach trainer.lr); lower it (0: none)"
        )
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise ConfigError(f"trainer.betas={list(t.betas)} must be two numbers in [0, 1) (AdamW's beta1, beta2)")
    if problem := schedule_problem(t, list(t.keep_checkpoints_at), t.branch_step, t.branch_from is not None):
        raise ConfigError(problem)


def validate(cfg: DictConfig) -> None:
    check_settings(cfg)
    validate_model(cfg.model)
    for group in ("trainer", "data", "harness"):
        check_bounds(cfg[group], group)
    if StageKind.of(cfg).trains:  # an evaluation's trainer is the recipe its source trained with
        check_schedule(cfg.trainer)
    elif (check_loops := spec_of(cfg.model).check_loops) is not None:  # an evaluation at another R: one it can run
        check_loops(cfg.model, cfg.stage.eval_n_loops, "stage.eval_n_loops")
    t = cfg.trainer
    if t.seq_len > cfg.model.max_seq_len:
        raise ConfigError(
            f"trainer.seq_len={t.seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}; "
            "lower one or raise the other"
        )
