"""Hydra's command line, its run of an app, and its value-override step: internals of Hydra's own `@hydra.main`
and `compose` that Hydra exposes no public form of."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from hydra import version
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra._internal.utils import (
    _run_hydra,
    create_automatic_config_search_path,
    detect_calling_file_or_module_from_task_function,
    detect_task_name,
    get_args_parser,
    run_and_report,
)
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig


def hydra_args_parser() -> argparse.ArgumentParser:
    """Hydra's own command-line parser (`hydra._internal.utils.get_args_parser`, private): the one place Hydra's
    flags are defined, so `python -m cart_sweeps` keeps Hydra's command line exactly. Checked on hydra-core 1.3.2
    and 1.3.8."""
    return get_args_parser()


def apply_overrides(overrides: list[Override], cfg: DictConfig) -> None:
    """Hydra's value-override step of a composition (`ConfigLoaderImpl._apply_overrides_to_config`, private) on a
    config composed already, with Hydra's own checks and errors: no public call applies overrides alone, without
    the slow defaults list. Checked on hydra-core 1.3.2 and 1.3.8."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def run_app(args: argparse.Namespace, task: Callable[[DictConfig], Any], config_dir: str, config_name: str) -> None:
    """What `@hydra.main(config_path=config_dir, config_name=...)(task)()` does, on a command line parsed already:
    its own flags through `hydra._internal.utils._run_hydra` (private; Hydra's only entry taking parsed arguments),
    a plain run straight through `Hydra.run` (private), as `_run_hydra` does after composing the config once more
    only to read `hydra.mode`. Checked on hydra-core 1.3.2 and 1.3.8."""
    version.setbase("1.3")  # @hydra.main(version_base="1.3"): a job runs where it was started, among others
    if args.cfg or args.info or args.help or args.hydra_help or args.shell_completion or args.multirun or args.resolve:
        _run_hydra(
            args=args,
            args_parser=hydra_args_parser(),
            task_function=task,
            config_path=config_dir,
            config_name=config_name,
        )
        return
    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(calling_file, calling_module, config_dir)
    if args.config_dir is not None:
        folder = f"file://{os.path.abspath(args.config_dir)}"
        search_path.prepend(provider="command-line", path=folder, anchor=SearchPathQuery(provider="schema"))
    try:
        hydra = run_and_report(
            lambda: Hydra.create_main_hydra2(
                task_name=detect_task_name(calling_file, calling_module), config_search_path=search_path
            )
        )
        overrides = [*args.overrides, "hydra.mode=RUN"]  # as _run_hydra adds it, so .hydra/hydra.yaml reads the same
        run_and_report(
            lambda: hydra.run(config_name=args.config_name or config_name, task_function=task, overrides=overrides)
        )
    finally:
        GlobalHydra.instance().clear()  # as _run_hydra leaves it
