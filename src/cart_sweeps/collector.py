"""Keep what lasts a command's process (its modules, a stage's configs, a ledger's history) out of the cyclic
garbage collector's scans, without keeping any garbage."""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def long_lived() -> Iterator[None]:
    """Build objects that live on with the collector paused (a context manager, or a decorator), then move them
    unscanned to its oldest generation (freeze, unfreeze): made with it running, each batch of young objects
    walked the growing heap again (a quarter of a 768-configuration expansion)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():  # else someone froze objects on purpose (before a fork): leave them be
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


def skip_final_collection() -> None:
    """At this process's exit, leave the objects alive then to the OS instead of collecting their cycles (0.5 s of
    a 3.5 s relaunch): the project closes what it writes itself, and the atexit handlers still run."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
