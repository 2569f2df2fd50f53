"""Words in messages and values as override text: helpers every layer may use."""

from __future__ import annotations

import re
from typing import Any


def count(n: int, noun: str) -> str:
    """`1 run`, `2 runs`, `0 runs`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def duration(hours: float) -> str:
    """A time in the unit that reads best: 3 days, 5.2 hours, 14 min, 9 s."""
    if hours >= 48:
        return f"{hours / 24:,.0f} days"
    if hours >= 1:
        return f"{hours:,.1f} hours"
    return f"{hours * 60:.0f} min" if hours * 60 >= 1 else f"{hours * 3600:.0f} s"


def clock(seconds: float) -> str:
    """An elapsed or remaining time as a progress line shows it: 1h05m, 4m09s."""
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def first_line(err: BaseException) -> str:
    """An error's first non-blank line (its type's name where it says nothing): a message's one line."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


_BARE = re.compile(r"[A-Za-z_/][\w./-]*")  # a string Hydra's grammar reads unquoted
_RESERVED = {"true", "false", "null", "nan", "inf"}


def format_value(value: Any) -> str:
    """A value in Hydra's override grammar (strings quoted only when they need it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _BARE.fullmatch(text) and text.lower() not in _RESERVED:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def axis_value(value: Any) -> Any:
    """A grid value as a run's params hold it: a list or dict as its override text (`[0.9,0.95]`), hashable."""
    return format_value(value) if isinstance(value, list | tuple | dict) else value
