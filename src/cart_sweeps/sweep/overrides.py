"""Command-line overrides of a stage: which are grid axes, which pass to every run, how to write them.

A sweep value (`model.d_model=256,512`) or an override of a key the stage sweeps replaces that axis of
the stage's grid, in the paper's numbers. Any other override passes unchanged to every run, after the
stage's own values, so it wins. Launcher, sweep, plan and Hydra settings stay with the driver.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from hydra.core.override_parser.types import Override, QuotedString, RangeSweep, ValueType

from cart_sweeps.config import DRIVER_GROUPS, ConfigError

DRIVER_KEYS = ("hydra", *DRIVER_GROUPS)  # settings of the sweep (and Hydra's own), not of its runs


@dataclass
class Arguments:
    """Command-line overrides split by role."""

    stage: str | None = None
    axes: dict[str, Iterable[Any]] = field(default_factory=dict)  # key -> values, listed once the stage counted them
    sizes: dict[str, int] = field(default_factory=dict)  # key -> how many values it has
    passed: dict[str, str] = field(default_factory=dict)  # key -> override line for every run
    base: list[str] = field(default_factory=list)  # every single-valued override: the base config


def sweep_size(o: Override) -> int:
    """How many values a sweep has, a range's from its bounds (range(0,2000000) is not listed to be counted)."""
    value = o.value()
    if not isinstance(value, RangeSweep):  # a choice: its values are written out
        return sum(1 for _ in o.sweep_iterator())
    if not value.step:
        raise ConfigError(f"{o.input_line}: a range's step cannot be 0")
    span = value.range()
    if isinstance(span, range):
        return len(span)
    return max(0, math.ceil((Decimal(span.stop) - Decimal(span.start)) / Decimal(span.step)))  # as Hydra steps it


def _listed(o: Override) -> Iterator[Any]:
    """A sweep's values, listed only once iterated (Hydra lists a shuffled range whole when asked for them), as
    Hydra's value() gives them: a quoted one ('paper', [a,'b']) as its text, not a QuotedString."""
    yield from o.sweep_iterator(transformer=_unquoted)


def _unquoted(value: Any) -> Any:
    """A parsed value with each QuotedString (in lists and dicts too) as its text, as `Override.value()` has it."""
    if isinstance(value, list):
        return [_unquoted(v) for v in value]
    if isinstance(value, dict):
        return {_unquoted(k): _unquoted(v) for k, v in value.items()}
    return value.text if isinstance(value, QuotedString) else value


def _root(key: str) -> str:
    return re.split(r"[./@]", key.lstrip("+~"), maxsplit=1)[0]


def split_arguments(parsed: Sequence[Override], stage_axes: Sequence[str]) -> Arguments:
    """Sort the parsed command line (compose.parse_overrides) into the stage name, grid axes, per-run overrides
    and the base config's."""
    out = Arguments()
    for o in parsed:
        assert o.input_line is not None  # the parser records every override's text
        key = o.key_or_group
        if key == "stage":
            if o.is_sweep_override():
                raise ConfigError(f"{o.input_line}: one stage per sweep; launch each stage on its own")
            out.stage = str(o.value())
        if o.value_type == ValueType.INTERVAL_SWEEP:
            raise ConfigError(
                f"{o.input_line}: an interval is a search range; write it as stage.search.{key}: {{low, high, log}} "
                "in a stage file (sweeps/lr.yaml) and run it with sweep.sampler=tpe sweep.n_trials=N"
            )
        if o.value_type == ValueType.GLOB_CHOICE_SWEEP:
            raise ConfigError(f"{o.input_line}: glob() picks config group options; list the values: {key}=a,b")
        if o.is_sweep_override():
            out.axes[key], out.sizes[key] = _listed(o), sweep_size(o)
            if not out.sizes[key]:
                raise ConfigError(
                    f"{o.input_line} sweeps no values: give {key} at least one (a range's stop past its start)"
                )
            continue
        if key in stage_axes:
            out.axes[key], out.sizes[key] = [o.value()], 1
            continue
        out.base.append(o.input_line)
        if key != "stage" and _root(key) not in DRIVER_KEYS:
            out.passed[key] = o.input_line
    return out
