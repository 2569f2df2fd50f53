"""What a running stage tells its user: a line per finished run, a live status line, a closing summary."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.text import Text

from cart_sweeps.record.summary import RunSummary
from cart_sweeps.status import RunStatus
from cart_sweeps.text import clock

FINAL = (
    RunStatus.COMPLETED,
    RunStatus.FAILED,
    RunStatus.DIVERGED,
    RunStatus.CANCELLED,
    RunStatus.REJECTED,
    RunStatus.PRUNED,
)


class Progress:
    """Counts of this launch, with an ETA from the pace of the runs finished so far: live at a terminal's bottom,
    else on each finished run's line. `left`: runs still to start, where a search learns it as it goes."""

    def __init__(
        self,
        stage: str,
        to_run: int,
        metric: str,
        console: Console | None = None,
        left: Callable[[], int] | None = None,
    ) -> None:
        self.stage, self.to_run, self.metric, self.left = stage, to_run, metric, left
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.counts: Counter[str] = Counter()
        self.running = 0
        self.why_waiting: str | None = None
        self.t0 = time.monotonic()
        self.live = Live(console=self.console, transient=True) if self.console.is_terminal else None

    def __enter__(self) -> Progress:
        if self.live:
            self.live.start()
            self._refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.stop()

    def status(self) -> str:
        done = sum(self.counts[s] for s in FINAL)
        if self.left is not None:
            self.to_run = done + self.running + max(0, self.left())
        left = max(0, self.to_run - done - self.running)
        elapsed = time.monotonic() - self.t0
        eta = clock(elapsed / done * (left + self.running)) if done else "?"
        return (
            f"stage {self.stage}: {done}/{self.to_run} done, {self.running} running, "
            f"{sum(self.counts[s] for s in FINAL if not s.is_result)} failed, {left} left, ETA {eta}"
            + (f"; {self.why_waiting}" if self.why_waiting else "")
        )

    def _refresh(self) -> None:
        if self.live:
            self.live.update(Text(self.status()))

    def waiting(self, why: str | None) -> None:
        """Why started runs wait (a scheduler's pending reasons); printed when it changes, in a log."""
        if why != self.why_waiting and why and not self.live:
            self.console.print(f"stage {self.stage}: {why}", markup=False)
        self.why_waiting = why
        self._refresh()

    def started(self) -> None:
        self.running += 1
        self._refresh()

    def finished(
        self, label: str, status: RunStatus, summary: RunSummary, final: bool, log: Path | None = None
    ) -> None:
        """A run ended; `final` False means it failed and will be tried again; `log`: the run's output."""
        self.running -= 1
        if final:
            self.counts[status] += 1
        value = summary.value(self.metric)
        if status == RunStatus.PRUNED:
            detail = f"at step {summary.step}"
        else:
            detail = f"{self.metric}={value:.4g}" if status == RunStatus.COMPLETED and value else summary.error or ""
        retry = "" if final else " (retrying)"
        line = f"{label}: {status}{retry} {detail}".rstrip()
        if status not in (RunStatus.COMPLETED, RunStatus.PRUNED) and log is not None and log.exists():
            line += f" (output: {log})"
        self.console.print(line if self.live else f"{line}  [{self.status()}]", markup=False)
        self._refresh()

    def close(self, skipped: int, ledger: str, interrupted: bool) -> None:
        """The closing summary of this launch."""
        counts = ", ".join(f"{self.counts[s]} {s}" for s in FINAL)
        how = "interrupted after" if interrupted else "finished in"
        took = clock(time.monotonic() - self.t0)
        self.console.print(
            f"stage {self.stage}: {counts}, {skipped} skipped (done before); {how} {took}; ledger {ledger}",
            markup=False,
        )
