"""The Hydra Launcher of cart_sweeps: submitit local slots or SLURM arrays (launcher=local|slurm).

The stage sweeper drives its pools directly (a run starts the moment a slot frees); `launch` serves
Hydra's plain batch API for other sweepers. Either way each job executes its run's config in-process.
"""

# No `from __future__ import annotations`: Hydra's plugin scan runs this module before it is in
# sys.modules, where dataclasses would look string annotations up.
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
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
        from cart_sweeps.sweep.batch import run_batch
        from cart_sweeps.sweep.pool import make_pool

        return [
            JobReturn(
                overrides=run.overrides,
                cfg=run.config.cfg,
                _return_value=summary,
                working_dir=str(run.run_dir),
                status=JobStatus.COMPLETED,  # how the run ended is in its summary; the job itself ran
            )
            for run, summary in run_batch(job_overrides, make_pool)
        ]
