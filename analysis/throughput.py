"""Noise one cannot see, said (issue 49): a run's tokens/s measured while other runs shared its cores (or GPU) is
what they left it, so a table or decision that reads it says so, with how far one configuration's seeds spread."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from cart_sweeps.metric import THROUGHPUT, seed_spreads

SHARED = "shared_with"  # load.py's column: "2 runs at once on 2 CPU cores" where the launcher ran several at once


def shared(env: dict[str, Any]) -> dict[str, str]:
    """The column a run's recorded environment gives: where it ran beside others, if it did."""
    n = env.get("runs_at_once")
    if not isinstance(n, int) or n < 2:  # alone, or a record from before runs said it
        return {}
    on = "one GPU" if env.get("cuda_visible_devices") else f"{env.get('cpu_cores')} CPU cores"
    return {SHARED: f"{n} runs at once on {on}"}


def note(rows: pd.DataFrame, columns: Iterable[object]) -> str | None:
    """A line for a table (or decision) of `columns` over `rows` that reads tokens/s measured beside other runs."""
    if SHARED not in rows or not any(str(c).startswith(THROUGHPUT) for c in columns):
        return None
    rows = rows[rows[SHARED].notna()]
    if rows.empty:
        return None
    measured = rows.dropna(subset=[THROUGHPUT])
    spreads = seed_spreads(zip(measured["config"], measured[THROUGHPUT], strict=True))
    told = (
        f"the seeds of one configuration differ by up to {max(spreads):.0%}"
        if spreads
        else "its spread is not measured (no configuration has two seeds)"
    )
    return f"{THROUGHPUT} measured with {' or '.join(dict.fromkeys(rows[SHARED]))}: {told}"
