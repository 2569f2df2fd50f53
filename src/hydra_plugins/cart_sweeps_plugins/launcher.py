"""The Hydra Launcher of cart_sweeps: its settings are the `launcher` group (launcher=local|slurm), and the stage
sweeper drives its pools directly (a run starts the moment a slot frees). Hydra's batch API (`launch`, which
another sweeper would call) runs nothing: the project's command sends every multirun to the stage sweeper.
"""

# No `from __future__ import annotations`: Hydra's plugin scan runs this module before it is in
# sys.modules, where dataclasses would look string annotations up.
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class CartLauncherConf:
    _target_: str = "hydra_plugins.cart_sweeps_plugins.launcher.CartLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="cart_sweeps", node=CartLauncherConf, provider="cart_sweeps")


class CartLauncher(Launcher):
    """Settings live in the `launcher` config group (conf/launcher/*.yaml), not under hydra."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        print(
            "error: the cart_sweeps launcher runs the cart_sweeps sweeper's stages: drop hydra/sweeper=...",
            file=sys.stderr,
        )
        sys.exit(2)
