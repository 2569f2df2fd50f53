"""A command's exit without the interpreter's last garbage collection.

A driver that named a thousand runs holds about 100,000 objects in reference cycles (an OmegaConf node points
to its parent), and collecting them at exit took 0.5 s of a 3.2-3.8 s relaunch of a finished stage. Python does
not promise finalizers for objects alive at exit, and the project flushes and closes what it writes itself
(atomic writes, `wandb.finish`, the ledger's commits), so freezing them for good loses nothing; the atexit
handlers (logging's flush among them) still run.
"""

from __future__ import annotations

import atexit
import gc


def skip_final_collection() -> None:
    """At this process's exit, leave the objects alive then to the OS instead of collecting their cycles
    (once per process, however often a command's entry point is called)."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
