"""The one mapping from a stage's paper numbers to explicit overrides at the current scale (docs/scale.md).

The sweeper and `plan` both call `to_scale`, so what is planned is what runs; a width given as the scale shows it
(d_model=32 at scale=tiny) is read back to the paper's number by `to_paper` (the width table is one-to-one).
Two values of an axis the mapping would make one are refused (`check_apart`): their runs would be one run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from omegaconf import DictConfig

from cart_sweeps.config import IN_STEPS, ConfigError, ScaleConfig, TrainerConfig, keys_with
from cart_sweeps.schedule import branchable

Scale = ScaleConfig | DictConfig  # the scale group, as a dataclass (a stage reads it per run: faster) or composed

# Keys shrunk with the run's length; at a train stage each is always emitted (from the paper recipe when
# the stage does not state it), so a run's schedule, evals and checkpoints shrink with its length.
_STEP_KEYS = tuple(f"trainer.{key}" for key in keys_with(TrainerConfig, IN_STEPS))
_SEQ_KEYS = ("trainer.seq_len", "model.max_seq_len")
_BATCH_KEYS = ("trainer.micro_batch_size",)


def steps_at(paper_steps: int, scale: Scale) -> float:
    """A run length at this scale, by one rule for every length, so longer runs stay longer (a ladder's rungs in
    order): the `steps` table's lengths joined by power laws (straight lines on log-log axes), the last one
    continued past the table, and lengths below its first shrunk by that first length's ratio; no table: the
    divisor. Rounded where it is applied."""
    knots = sorted((int(k), int(v)) for k, v in scale.steps.items())
    if not knots:
        return paper_steps / scale.steps_divisor
    if paper_steps <= knots[0][0] or len(knots) == 1:
        return paper_steps * knots[0][1] / knots[0][0]
    (k1, v1), (k2, v2) = next(((a, b) for a, b in pairwise(knots) if paper_steps <= b[0]), knots[-2:])
    return v1 * (paper_steps / k1) ** (math.log(v2 / v1) / math.log(k2 / k1))


def check_steps_table(scale: Scale) -> None:
    """A table that maps a longer run to a shorter or equal one would reorder a ladder's horizons."""
    knots = sorted((int(k), int(v)) for k, v in scale.steps.items())
    if any(v < 1 for _, v in knots) or any(b[1] <= a[1] for a, b in pairwise(knots)):
        raise ConfigError(
            f"scale.steps={dict(knots)} must map longer runs to longer ones (each value >= 1 and above the one "
            f"before); fix conf/scale/{scale.name}.yaml"
        )


def _shrink(value: int, factor: float) -> int:
    """At least 1; a value that is not positive is left for validation to name, never made valid."""
    return max(1, round(value * factor)) if value > 0 else value


def _widths(scale: Scale) -> dict[int, int]:
    return {int(k): v for k, v in scale.d_model.items()}


def _width(d: int, scale: Scale) -> int:
    if not scale.d_model:
        return d
    table = _widths(scale)
    if d not in table:
        raise ConfigError(
            f"model.d_model={d} is neither a paper width ({', '.join(map(str, sorted(table)))}) nor one of their "
            f"widths at scale={scale.name} ({', '.join(map(str, sorted(table.values())))}), so the stage's paper "
            f"numbers cannot map it; to use {d} as written, write the stage's numbers at the run's scale "
            f"(stage.numbers: own in its file), or add {d} to scale.d_model"
        )
    return table[d]


def _folded(micro_batch_size: Any, grad_accum: Any) -> dict[str, int]:
    """The accumulation steps of a stated batch folded into one micro-batch (same tokens per step)."""
    if isinstance(micro_batch_size, int) and isinstance(grad_accum, int) and grad_accum > 1:
        return {"trainer.micro_batch_size": micro_batch_size * grad_accum, "trainer.grad_accum": 1}
    return {}


def to_paper(key: str, value: Any, scale: Scale) -> Any:
    """A grid value as the paper's number: a width this scale shows (32 at tiny) read back through its table; a
    number that is also a paper width reads as the paper's."""
    if key != "model.d_model" or not scale.d_model:
        return value
    table = _widths(scale)
    back = {small: paper for paper, small in table.items()}
    return value if value in table else back.get(value, value)


def to_scale(paper: dict[str, Any], scale: Scale, paper_value: Callable[[str], Any], train: bool) -> dict[str, Any]:
    """`paper` (override key -> value in the paper's numbers) at `scale`; `paper_value(key)` gives the paper's
    value of a scaled key the stage does not state (warm-up, eval and checkpoint intervals, max sequence)."""
    out = dict(paper)
    if train:
        for key in (*_STEP_KEYS, *_SEQ_KEYS, *_BATCH_KEYS):
            out.setdefault(key, paper_value(key))
        out["model.head_dim"] = scale.head_dim
        out["trainer.eval_windows"] = scale.eval_windows or paper_value("trainer.eval_windows")
    factors = {key: 1 / scale.seq_len_divisor for key in _SEQ_KEYS}
    factors |= {key: 1 / scale.batch_divisor for key in _BATCH_KEYS}
    steps = out.get("trainer.steps")
    if isinstance(steps, int) and steps > 0:  # a bad value is left for validation to name
        check_steps_table(scale)
        factors |= {key: steps_at(steps, scale) / steps for key in _STEP_KEYS}
        if train and branchable(out.get("trainer.schedule", paper_value("trainer.schedule"))):
            # every horizon warms up alike, so one run's stable phase is every shorter run's (docs/wsd.md)
            factors["trainer.warmup_steps"] = 1 / scale.steps_divisor
    for key, factor in factors.items():
        if key in out and isinstance(out[key], int) and factor != 1:
            out[key] = _shrink(out[key], factor)
    if train and scale.fold_accumulation:
        out |= _folded(out.get("trainer.micro_batch_size"), out.get("trainer.grad_accum"))
    if train and scale.eval_every is not None and isinstance(out["trainer.steps"], int):
        out["trainer.eval_every"] = min(scale.eval_every, out["trainer.steps"])
    if "model.d_model" in out:
        out["model.d_model"] = _width(out["model.d_model"], scale)
    return out


def check_apart(
    stage: str,
    axes: dict[str, list[Any]],
    paper: dict[str, Any],
    scale: Scale,
    paper_value: Callable[[str], Any],
    train: bool,
) -> None:
    """Refuse an axis two of whose values `to_scale` maps to one (warm-ups 2 and 8 are both 1 step at
    scale=tiny): its runs would be one run. Each value is mapped beside the stage's recipe (`paper`)."""
    for key, values in axes.items():
        mapped: dict[Any, Any] = {}
        for value in values:
            at = to_scale({**paper, key: value}, scale, paper_value, train).get(key, value)
            if repr(at) in mapped and (other := mapped[repr(at)]) != value:
                raise ConfigError(
                    f"stage {stage}: {key} {other} and {value} are both {at} at scale={scale.name} (the stage's "
                    f"numbers are the paper's, and scale={scale.name} shrinks them), so their runs would be one; "
                    "write the stage's numbers at the run's scale (stage.numbers: own in its file), or pick values "
                    "that stay apart"
                )
            mapped[repr(at)] = value


def mapping_line(stage: str, scale: str, changed: list[tuple[str, Any, Any]]) -> str | None:
    """What the scale mapping changed, in one line: each key with its paper value(s) -> the run's; None where
    it changed nothing. `changed`: (key, paper value, value at the scale) of every run configuration."""
    pairs: dict[str, dict[str, str]] = {}
    for key, paper, actual in changed:
        pairs.setdefault(key, {})[repr(paper)] = f"{paper} -> {actual}"
    if not pairs:
        return None
    shown = "; ".join(f"{key} {', '.join(sorted(p.values(), key=_numeric))}" for key, p in pairs.items())
    return (
        f"stage {stage} at scale={scale}: its paper numbers mapped: {shown} (a stage file writes its numbers at "
        "the run's scale with stage.numbers: own; docs/scale.md)"
    )


def _numeric(text: str) -> tuple[float, str]:
    """A `paper -> actual` pair's sort key: by its paper number where it is one."""
    head = text.split(" ", 1)[0]
    try:
        return float(head), text
    except ValueError:
        return float("inf"), text
