"""A stage run from a command's overrides: the one way in to the driver, for `python -m cart_sweeps stage=...`
(which calls it straight from its own parse) and for the Hydra sweeper plugin (a Hydra multirun of any app)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cart_sweeps.collector import long_lived
from cart_sweeps.config import ConfigError


def run_stage_command(arguments: Sequence[str]) -> int:
    """Run the stage `arguments` name (a command's overrides less Hydra's own, as Hydra hands a sweeper its task
    overrides) on the pool of its launcher group; the exit code: 0, 1 when a run failed, 2 on a config error
    (printed as one line), 130 when interrupted."""
    with long_lived():  # the driver's modules last the process; imported here, so a single run never loads them
        from cart_sweeps.sweep.driver import run_stage
        from cart_sweeps.sweep.pool import make_pool
    try:
        return run_stage(arguments, make_pool)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
