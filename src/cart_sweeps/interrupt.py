"""Stop signals that a process cannot lose: a KeyboardInterrupt raised inside a weakref callback or `__del__`
(torch.compile's many) is printed and dropped, so the handler remembers each signal, and long loops (the
driver's refills, a run's steps) call `raise_if_received`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | int | None  # what signal.signal returns
_received: list[int] = []  # the stop signals this process has received since `install`


def _remember_and_raise(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def install(*signals: signal.Signals) -> dict[signal.Signals, Handler]:
    """Each of `signals` (SIGINT by default) stops this process as Ctrl-C does, whatever the launching shell
    left (a command started with `&` or nohup has SIGINT ignored); the handlers replaced, for `restore`."""
    _received.clear()
    return {sig: signal.signal(sig, _remember_and_raise) for sig in signals or (signal.SIGINT,)}


def restore(previous: dict[signal.Signals, Handler]) -> None:
    """The handlers `install` replaced, back; the signals received since, handled (forgotten)."""
    _received.clear()
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def raise_if_received() -> None:
    """Raise again the KeyboardInterrupt of a stop signal already received, in case its first raise was lost."""
    if _received:
        raise KeyboardInterrupt(f"signal {_received[0]}")
