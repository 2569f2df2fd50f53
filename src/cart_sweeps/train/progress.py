"""What a training run shows while it trains (step, loss, tokens/s, the time left): a tqdm bar on a terminal,
in a log a plain line at most every PLAIN_EVERY_S seconds and at the last step."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

from cart_sweeps.text import clock

PLAIN_EVERY_S = 10.0


class RunProgress:
    """Fed each logged train row; the pace is measured from the first row it sees (a resumed run's too)."""

    def __init__(self, label: str, steps: int, stream: TextIO | None = None) -> None:
        self.label, self.steps = label, steps
        self.stream = stream or sys.stderr
        self.bar: tqdm | None = None
        self.first: tuple[int, float] | None = None
        self.printed_at = 0.0

    def update(self, row: dict[str, Any]) -> None:
        step, now = row["step"], time.monotonic()
        stats = {"loss": f"{row['loss']:.4f}", "tokens/s": f"{row['tokens_per_s']:,.0f}"}
        if self.first is None:
            self.first = (step, now)
            if self.stream.isatty():
                self.bar = tqdm(total=self.steps, initial=step, desc=self.label, unit="step", file=self.stream)
        if self.bar is not None:
            self.bar.set_postfix(stats, refresh=False)
            self.bar.update(step - self.bar.n)
        elif step == self.steps or step == self.first[0] or now - self.printed_at >= PLAIN_EVERY_S:
            self.printed_at = now
            print(
                f"{self.label}: step {step}/{self.steps} loss {stats['loss']} {stats['tokens/s']} tokens/s "
                f"ETA {self.eta(step, now)}",
                file=self.stream,
                flush=True,
            )

    def eta(self, step: int, now: float) -> str:
        assert self.first is not None
        done = step - self.first[0]
        return clock((now - self.first[1]) / done * (self.steps - step)) if done else "?"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
