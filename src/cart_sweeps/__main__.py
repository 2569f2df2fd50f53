"""`python -m cart_sweeps [overrides]` trains one run; `python -m cart_sweeps stage=<name>` runs a stage.

A single run writes to hydra.run.dir (default runs/single/<label>) and resumes there when relaunched.
Naming a stage makes the command a Hydra multirun (with or without -m): Hydra hands the overrides to the
project's sweeper (hydra_plugins/cart_sweeps_plugins). Hydra's own flags (--config-dir, --config-name,
--cfg, --info, -sc) work as in any Hydra app.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import cast

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from cart_sweeps.compose import compose_config, describe, quote_stage, use_config_sources
from cart_sweeps.config import CONF_DIR, ConfigError, check_settings, register_configs
from cart_sweeps.status import RunStatus

register_configs()
SWEEPER = "cart_sweeps"  # the stage sweeper's name in hydra/sweeper (hydra_plugins/cart_sweeps_plugins)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _run(cfg: DictConfig) -> None:
    from cart_sweeps.train.run import execute

    try:
        summary = execute(cfg, Path(HydraConfig.get().runtime.output_dir))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if summary.status != RunStatus.COMPLETED:
        print(f"{summary.label}: {summary.status}: {summary.error or ''}", file=sys.stderr)
        sys.exit(1)
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in summary.metrics.items() if k.startswith("ppl_"))
    print(f"{summary.label}: completed at step {summary.step}: {metrics}")


def parse(args: list[str]) -> argparse.Namespace:
    """The command line as Hydra itself reads it: its flags, their values, and the overrides."""
    return get_args_parser().parse_args(args)


def named_stage(overrides: list[str]) -> str | None:
    """The stage the overrides name (`stage=1`), if any: naming one runs it as a multirun (with our sweeper)."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        raise ConfigError(describe(err)) from err
    names = [o.value() for o in parsed if o.key_or_group == "stage" and not o.is_delete()]
    stage = str(names[-1]) if names and names[-1] is not None else None
    sweepers = [str(o.value()) for o in parsed if o.key_or_group == "hydra/sweeper"]
    if stage is not None and sweepers and sweepers[-1] != SWEEPER:  # another would run it without a ledger
        raise ConfigError(f"hydra/sweeper={sweepers[-1]}: a stage runs through the {SWEEPER} sweeper; drop it")
    return stage


def precheck(overrides: list[str]) -> None:
    """Compose the command's config once, so a bad override is one line before Hydra starts anything.

    Sweep overrides (`a=1,2`) are checked with their first value; interval sweeps are the stage's to name.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        raise ConfigError(describe(err)) from err
    single = [
        o.input_line for o in parsed if not o.is_sweep_override() and not o.get_key_element().startswith("hydra.")
    ]
    single += [
        f"{o.get_key_element()}={next(o.sweep_string_iterator())}"
        for o in parsed
        if o.is_sweep_override() and o.value_type not in (ValueType.INTERVAL_SWEEP, ValueType.GLOB_CHOICE_SWEEP)
    ]
    check_settings(compose_config(cast(list[str], single)))  # the parser records every override's text


def show_stage(overrides: list[str], command: list[str]) -> None:
    """`--cfg job` / `--help` under a stage: the stage as composed and its runs, not one run's config."""
    from cart_sweeps.sweep.expand import Stage

    try:
        stage = Stage(overrides)
    except ConfigError as err:  # still show the stage as written, and what it lacks to run
        print(OmegaConf.to_yaml(compose_config(overrides).stage), end="")
        print(f"# to run it: {err}")
        return
    print(f"# stage {stage.name} at scale={stage.base.scale.name} (paper numbers; see `scale` in README)")
    print(OmegaConf.to_yaml(stage.spec), end="")
    if stage.runs:
        print(f"# its {len(stage.runs)} runs (label-id: the overrides each run receives)")
        for run in stage.runs:
            print(f"{run.label}-{run.run_id[:8]}: {' '.join(run.overrides[1:])}")
    else:
        print(f"# a search: sweep.n_trials={stage.base.sweep.n_trials} runs, sampled as the stage runs")
    shown = [a for a in command if a not in ("--help", "-h", "--cfg", "-c", "job", "all")]
    print(f"# cost and ledger status: python -m cart_sweeps.plan {' '.join(shown)}")


def main() -> None:
    args = quote_stage(sys.argv[1:])
    try:
        ns = parse(args)
        use_config_sources(ns.config_dir, ns.config_name, ns.overrides)
        stage = named_stage(ns.overrides)
        if stage is not None and (ns.help or ns.cfg in ("job", "all")):
            show_stage(ns.overrides, sys.argv[1:])
            return
        if not (ns.help or ns.hydra_help or ns.cfg or ns.info or ns.shell_completion):
            precheck(ns.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if stage is not None and not (ns.multirun or ns.cfg or ns.info or ns.shell_completion or ns.hydra_help):
        args = ["-m", *args]  # naming a stage runs it: a Hydra multirun through the stage sweeper
    sys.argv[1:] = args
    _run()


if __name__ == "__main__":
    main()
