"""`python -m cart_sweeps [overrides]` trains one run; `-m stage=<name>` runs a stage of the study.

A single run writes to hydra.run.dir (default runs/<stage>/<label>) and resumes there when relaunched.
With -m, Hydra hands the overrides to the project's sweeper (hydra_plugins/cart_sweeps_plugins).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from cart_sweeps.compose import quote_stage
from cart_sweeps.config import CONF_DIR, ConfigError, register_configs

register_configs()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _run(cfg: DictConfig) -> None:
    from cart_sweeps.train.run import execute

    try:
        summary = execute(cfg, Path(HydraConfig.get().runtime.output_dir))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if summary["status"] != "completed":
        print(f"{summary['label']}: {summary['status']}: {summary.get('error', '')}", file=sys.stderr)
        sys.exit(1)
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in summary.items() if k.startswith("ppl_"))
    print(f"{summary['label']}: completed at step {summary['step']}: {metrics}")


def main() -> None:
    sys.argv[1:] = quote_stage(sys.argv[1:])
    _run()


if __name__ == "__main__":
    main()
