"""The Hydra Sweeper for `python -m cart_sweeps -m stage=<name> ...`: a thin wrapper over the stage driver.

Hydra hands it the command line; the driver expands the stage, keeps the Optuna ledger and runs each
run through the Hydra launcher (ours, which owns the submitit pools).
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
        from cart_sweeps.collector import long_lived
        from cart_sweeps.config import ConfigError

        with long_lived():  # the driver's modules last the process
            from cart_sweeps.sweep.driver import run_stage
        from hydra_plugins.cart_sweeps_plugins.launcher import CartLauncher

        try:
            if not isinstance(self.launcher, CartLauncher):
                raise ConfigError("the cart_sweeps sweeper runs through its own launcher: drop hydra/launcher=...")
            code = run_stage(arguments, self.launcher.make_pool)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        if code:
            sys.exit(code)
