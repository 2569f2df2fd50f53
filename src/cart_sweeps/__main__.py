"""`python -m cart_sweeps [overrides]` trains one run; `python -m cart_sweeps stage=<name>` runs a stage.

Both from this command's one parse: a single run as `@hydra.main` runs it (adapters.hydra.run_app, in
hydra.run.dir), a stage (with or without -m) through the stage driver (cart_sweeps.sweep.command). A multirun
naming no stage runs the anonymous stage `adhoc` over the keys it sweeps (sweeps/adhoc.yaml).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import sys
from pathlib import Path
from typing import NoReturn, cast

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import Override, ValueType
from omegaconf import DictConfig, OmegaConf

from cart_sweeps import collector, interrupt
from cart_sweeps.adapters.hydra import hydra_args_parser, run_app
from cart_sweeps.compose import compose_config, parse_overrides, quote_stage, use_config_sources
from cart_sweeps.composer import Composer
from cart_sweeps.config import CONF_DIR, ConfigError
from cart_sweeps.naming import check_stage_name
from cart_sweeps.register import register_configs
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.command import run_stage_command
from cart_sweeps.text import count
from cart_sweeps.validate import check_interpolations, check_settings

PLUGINS = "cart_sweeps"  # the name of the project's sweeper and launcher in hydra/sweeper, hydra/launcher
HYDRA_PLUGIN_GROUPS = ("hydra/sweeper", "hydra/launcher")

# Shell completion (`-sc install=bash`): Hydra's own script completes `python FILE.py` only, so this one
# recognises `python -m cart_sweeps` and `cart-sweeps` alike and asks Hydra's query (`-sc query=bash`).
COMPLETE_FUNCTION = "_cart_sweeps_complete"
COMPLETED_COMMANDS = "python python3 cart-sweeps"

COMPLETION_INSTALL = f"""\
{COMPLETE_FUNCTION}() {{
    local words=($COMP_LINE) helper
    if [[ "${{words[0]}}" == *cart-sweeps ]]; then
        helper="${{words[0]}}"
    elif [[ "${{words[0]}}" == *python* && "${{words[1]}}" == -m && "${{words[2]}}" == cart_sweeps ]]; then
        helper="${{words[0]}} -m cart_sweeps"
    else
        return  # any other python command: the shell's default completion
    fi
    local choices
    choices=$(COMP_POINT=$COMP_POINT COMP_LINE=$COMP_LINE $helper -sc query=bash 2>/dev/null)
    COMPREPLY=($(compgen -o nospace -o default -W "$choices" -- "${{words[$COMP_CWORD]}}"))
}}
COMP_WORDBREAKS=${{COMP_WORDBREAKS//=}}
complete -o nospace -o default -F {COMPLETE_FUNCTION} {COMPLETED_COMMANDS}"""
COMPLETION_UNINSTALL = f"complete -r {COMPLETED_COMMANDS} 2>/dev/null; unset -f {COMPLETE_FUNCTION}"

_MODULE_LINE = re.compile(r"^\s*\S*python[\d.]*\s+-m\s+cart_sweeps(?=\s|$)")


def completion_script(overrides: list[str]) -> str | None:
    """The script for `-sc install=bash|zsh` or `uninstall=...`; None for what Hydra answers itself (queries)."""
    scripts = {"install": COMPLETION_INSTALL, "uninstall": COMPLETION_UNINSTALL}
    return next((scripts[a] for a in (o.partition("=")[0] for o in overrides) if a in scripts), None)


def name_the_program_once() -> None:
    """`python -m cart_sweeps ARGS` -> `cart_sweeps ARGS` in COMP_LINE: Hydra's query strips one word as the
    program (or `python FILE`), and would read `-m cart_sweeps` as overrides."""
    line = os.environ.get("COMP_LINE", "")
    if _MODULE_LINE.match(line):
        os.environ["COMP_LINE"] = _MODULE_LINE.sub("cart_sweeps", line, count=1)


def train(cfg: DictConfig) -> None:
    """The single run's task, run by Hydra in its output folder (hydra.run.dir)."""
    from cart_sweeps.run import execute

    interrupt.install()
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


def _refuse(message: str) -> NoReturn:
    raise ConfigError(message)


def parse(args: list[str]) -> argparse.Namespace:
    """The command line as Hydra reads it, flags anywhere among the overrides; a mistake is one line."""
    parser = hydra_args_parser()
    parser.error = _refuse  # type: ignore[method-assign]
    return parser.parse_intermixed_args(args)


def named_stage(parsed: list[Override]) -> str | None:
    """The stage the overrides name (`stage=1`), if any; it runs on the project's sweeper and launcher alone."""
    names = [o.value() for o in parsed if o.key_or_group == "stage" and not o.is_delete()]
    stage = str(names[-1]) if names and names[-1] is not None else None
    for group, does in zip(HYDRA_PLUGIN_GROUPS, ("a stage runs through the", "a stage's jobs run on the"), strict=True):
        chosen = [str(o.value()) for o in parsed if o.key_or_group == group]
        if stage is not None and chosen and chosen[-1] != PLUGINS:  # another would run it without a ledger
            what = "sweeper" if group.endswith("sweeper") else "launcher (launcher=local|slurm)"
            raise ConfigError(f"{group}={chosen[-1]}: {does} {PLUGINS} {what}; drop it")
    return stage


def adhoc_stage(parsed: list[Override]) -> list[str]:
    """The overrides naming the anonymous stage of a multirun's swept keys (`stage=adhoc stage.name=adhoc-<hash>`)."""
    swept = sorted(o.get_key_element() for o in parsed if o.is_sweep_override() and not o.is_hydra_override())
    if not swept:
        raise ConfigError(
            "a multirun sweeps some key (model.n_loops=2,4) or runs a stage (stage=<name>); "
            "without either, drop -m to train one run"
        )
    digest = hashlib.sha256(",".join(swept).encode()).hexdigest()[:8]
    return ["stage=adhoc", f"stage.name=adhoc-{digest}"]


def basic_sweeper(parsed: list[Override]) -> list[Override]:
    """An ad-hoc multirun asking for Hydra's basic sweeper runs as the ad-hoc stage: one line says so."""
    chosen = [o for o in parsed if o.key_or_group == HYDRA_PLUGIN_GROUPS[0] and str(o.value()) == "basic"]
    if chosen:
        print(
            f"{chosen[-1].input_line}: this multirun runs the same runs through the {PLUGINS} sweeper, as an ad-hoc "
            "stage with a ledger (docs/commands.md)",
            file=sys.stderr,
        )
    return [o for o in parsed if o not in chosen]


def precheck(parsed: list[Override]) -> None:
    """Compose the command's config once, so a bad override is one line before Hydra starts anything; sweep
    overrides (`a=1,2`) are checked with their first value, interval sweeps left to the stage."""
    single = [
        o.input_line for o in parsed if not o.is_sweep_override() and not o.get_key_element().startswith("hydra.")
    ]
    sweeps = {
        f"{o.get_key_element()}={first}": o
        for o in parsed
        if o.is_sweep_override() and o.value_type not in (ValueType.INTERVAL_SWEEP, ValueType.GLOB_CHOICE_SWEEP)
        if (first := next(o.sweep_string_iterator(), None)) is not None  # an empty sweep is the stage's to name
    }
    try:  # the parser records every override's text; the composer keeps the base for the stage to find
        cfg = Composer()(cast(list[str], [*single, *sweeps]))
    except ConfigError as err:
        raise ConfigError(as_typed(str(err), sweeps)) from err
    check_settings(cfg)
    check_stage_name(cfg.stage.name)  # a single run's folder is under it too: <paths.runs>/<stage.name>/
    check_interpolations(cfg)


def as_typed(message: str, sweeps: dict[str, Override]) -> str:
    """Advice on a sweep's key checked at its first value (did you mean model.n_loops=2?) shows them as typed."""
    for line, o in sweeps.items():
        key, _, first = line.partition("=")
        if message.startswith(f"{key}: "):
            typed = f"={cast(str, o.input_line).partition('=')[2]}"
            return re.sub(rf"={re.escape(first)}(?=\?| or )", typed.replace("\\", "\\\\"), message)
    return message


def refuse_hydra_settings(parsed: list[Override], stage: str) -> None:
    """Under a stage, Hydra's own settings never reach the runs: each is one line, not ignored."""
    for o in parsed:
        key = o.get_key_element().lstrip("+~")
        if key.startswith("hydra.sweep.") or key == "hydra.run.dir":
            raise ConfigError(
                f"{o.input_line}: a stage's runs go to <paths.runs>/<stage>/<label>-<id>; "
                f"set paths.runs=DIR instead (its runs then land in DIR/{stage}/)"
            )
        if o.is_hydra_override() and key != "hydra.searchpath" and o.key_or_group not in HYDRA_PLUGIN_GROUPS:
            raise ConfigError(
                f"{o.input_line}: Hydra's own settings do not reach a stage's runs (its driver launches them; "
                "hydra.searchpath is the one it reads); drop it, or set it on one run without stage="
            )


def plan_command(ns: argparse.Namespace) -> str:
    """`python -m cart_sweeps.plan` with this command's config sources and overrides as typed, quoted."""
    flags = ["--config-dir", ns.config_dir] if ns.config_dir else []
    flags += ["--config-name", ns.config_name] if ns.config_name else []
    return shlex.join(["python", "-m", "cart_sweeps.plan", *flags, *ns.overrides])


def show_stage(ns: argparse.Namespace) -> None:
    """`--cfg job` / `--help` under a stage: the stage and its runs (`-p PACKAGE`: that package of each run)."""
    from cart_sweeps.sweep.expand import Stage

    try:
        stage = Stage(ns.overrides)
    except ConfigError as err:  # still show the stage as written, and what it lacks to run
        print(OmegaConf.to_yaml(compose_config(ns.overrides).stage), end="")
        print(f"# to run it: {err}")
        return
    if ns.package:
        for run in stage.runs:
            print(f"# {run.label}-{run.run_id[:8]}: {ns.package}")
            print(
                OmegaConf.to_yaml(OmegaConf.select(stage.compose(run.overrides), ns.package), resolve=ns.resolve),
                end="",
            )
        return
    print(f"# stage {stage.name} at scale={stage.base.scale.name} (paper numbers; see docs/scale.md)")
    print(OmegaConf.to_yaml(stage.spec), end="")
    if stage.runs:
        print(f"# its {count(len(stage.runs), 'run')} (label-id: the overrides each run receives)")
        for run in stage.runs:
            print(f"{run.label}-{run.run_id[:8]}: {' '.join(run.overrides[1:])}")
    else:
        trials = stage.base.sweep.n_trials
        print(f"# a search: sweep.n_trials={trials}: up to {count(trials, 'run')}, sampled as the stage runs")
    print(f"# cost and ledger status: {plan_command(ns)}")


def main() -> None:
    collector.skip_final_collection()
    try:
        register_configs()  # before Hydra's own flags read the config store; a stage file's mistake is one line
        ns = parse(sys.argv[1:])  # the command's one argparse pass: its overrides as typed
        if ns.shell_completion:
            if (script := completion_script(ns.overrides)) is not None:
                print(script)
                return
            name_the_program_once()
        parsed = parse_overrides(ns.overrides)  # each override through the grammar once: every reader shares it
        use_config_sources(ns.config_dir, ns.config_name, parsed)
        stage = named_stage(parsed)
        if stage is None and ns.multirun:
            parsed = basic_sweeper(parsed)
            anonymous = adhoc_stage(parsed)
            ns.overrides += anonymous
            parsed += parse_overrides(anonymous)
            stage = named_stage(parsed)
        if stage is not None:
            refuse_hydra_settings(parsed, stage)
        if stage is not None and (ns.help or ns.cfg in ("job", "all")):
            show_stage(ns)
            return
        if not (ns.hydra_help or ns.shell_completion):
            precheck(parsed)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if stage is not None and not (ns.cfg or ns.info or ns.shell_completion or ns.hydra_help):
        # naming a stage runs it, -m or not: the driver takes the overrides Hydra would hand its sweeper
        if code := run_stage_command([cast(str, o.input_line) for o in parsed if not o.is_hydra_override()]):
            sys.exit(code)
        return
    ns.overrides = quote_stage(ns.overrides)  # a single run, or Hydra's own view of the command
    run_app(ns, train, str(CONF_DIR), "config")


if __name__ == "__main__":
    main()
