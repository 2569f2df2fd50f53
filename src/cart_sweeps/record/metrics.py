"""metrics.jsonl read back: the one reader, for the resumed run, the driver's learning curves and the analysis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The logged events of a run's metrics.jsonl, in order: each line that is a JSON object with a step (one cut
    off mid-line is skipped; a file that cannot be read is no events)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [row for row in map(_parse, lines) if row is not None]


def _parse(line: str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and "step" in row else None
