"""`python -m cart_sweeps [overrides]` trains one run; `-m stage=<name>` runs a stage of the study.

A single run writes to hydra.run.dir (default runs/<stage>/<label>) and resumes there when relaunched.
With -m, Hydra hands the overrides to the project's sweeper (hydra_plugins/cart_sweeps_plugins).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig

from cart_sweeps.compose import compose_config, describe, quote_stage
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


def precheck(args: list[str]) -> None:
    """Compose the command's config once, so a bad override is one line before Hydra starts anything.

    Sweep overrides (`a=1,2`) are checked with their first value; Hydra's own flags are left to Hydra.
    """
    if {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info"} & set(args):
        return
    overrides = [a for a in args if not a.startswith("-") and not a.lstrip("+~").startswith("hydra.")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        raise ConfigError(describe(err)) from err
    single = [
        f"{o.get_key_element()}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else o.input_line
        for o in parsed
    ]
    compose_config(single)


def main() -> None:
    sys.argv[1:] = quote_stage(sys.argv[1:])
    try:
        precheck(sys.argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    _run()


if __name__ == "__main__":
    main()
