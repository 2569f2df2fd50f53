"""The Hydra Sweeper of cart_sweeps: a stage run by Hydra's own multirun (`hydra/sweeper=cart_sweeps` in any
Hydra app), handed to the stage driver's one entry (cart_sweeps.sweep.command), which `python -m cart_sweeps
stage=<name>` calls straight from its own parse.

Hydra hands it the command's overrides; the driver expands the stage, keeps the Optuna ledger and runs each
run on the pool of the `launcher` group (the Hydra launcher must be ours: it owns no other settings).
"""

# No `from __future__ import annotations`: Hydra's plugin scan runs this module before it is in
# sys.modules, where dataclasses would look string annotations up.
import sys
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class CartSweeperConf:
    _target_: str = "hydra_plugins.cart_sweeps_plugins.sweeper.CartSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="cart_sweeps", node=CartSweeperConf, provider="cart_sweeps")


class CartSweeper(Sweeper):
    """Runs one stage: validate every run, skip the done, resume the cut off, retry the failed."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from cart_sweeps.sweep.command import run_stage_command
        from hydra_plugins.cart_sweeps_plugins.launcher import CartLauncher

        if not isinstance(self.launcher, CartLauncher):
            print(
                "error: the cart_sweeps sweeper runs through its own launcher: drop hydra/launcher=...", file=sys.stderr
            )
            sys.exit(2)
        if code := run_stage_command(arguments):
            sys.exit(code)
