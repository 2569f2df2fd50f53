"""What the analysis cannot use: input it refuses (one error type) and input it leaves out (listed)."""

from __future__ import annotations

from dataclasses import dataclass


class AnalysisError(ValueError):
    """A problem with the input the user can fix; shown as one line, not a traceback."""


@dataclass(frozen=True)
class LeftOut:
    """A row of a results CSV, or a run, that the tables leave out: listed in the output, never dropped silently."""

    where: str  # "results.csv line 5", or the run ("1/d32-P2-R4-s1")
    kind: str  # for counts: not finite, out of range, duplicate, no <metric>
    reason: str

    def line(self) -> str:
        return f"left out {self.where}: {self.reason}"
