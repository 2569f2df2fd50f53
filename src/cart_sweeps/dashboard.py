"""`python -m cart_sweeps.dashboard stage=<name> [overrides]`: the stage's W&B workspace.

Panels: train loss, each validation PPL and rho against step, runs grouped by width and R. Online
(logger.mode=online with a key) it saves the workspace; offline it prints what it would create.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from cart_sweeps.compose import compose_config, run_cli
from cart_sweeps.config import ConfigError

USAGE = """usage: python -m cart_sweeps.dashboard stage=<name> [OVERRIDE ...]

Builds the W&B workspace of a stage (panels: train/loss, val/ppl_<set> for each validation set, rho,
against step; runs filtered to the stage and grouped by model.d_model and model.n_loops).
  python -m cart_sweeps.dashboard stage=1                                  # offline: print the plan
  WANDB_API_KEY=... python -m cart_sweeps.dashboard stage=1 logger.mode=online logger.entity=ME
"""


def panels_spec(cfg: DictConfig) -> dict[str, list[str]]:
    """Section name -> the metric keys plotted in it (the keys the trainer logs to W&B)."""
    sets = [v.name for v in cfg.data.validation]
    return {
        "Training": ["train/loss"],
        "Validation perplexity": [f"val/ppl_{name}" for name in sets],
        "Spectral radius": ["rho"],
    }


def build_workspace(cfg: DictConfig, entity: str):
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = [
        ws.Section(name=section, is_open=True, panels=[wr.LinePlot(title=key, x="Step", y=[key]) for key in keys])
        for section, keys in panels_spec(cfg).items()
    ]
    return ws.Workspace(
        entity=entity,
        project=cfg.logger.project,
        name=f"CART stage {cfg.stage.name} ({cfg.scale.name})",
        sections=sections,
        runset_settings=ws.RunsetSettings(
            filters=[ws.Config("stage.name") == cfg.stage.name],
            groupby=[ws.Config("model.d_model"), ws.Config("model.n_loops")],
        ),
    )


def dashboard(overrides: list[str]) -> None:
    cfg = compose_config(overrides)
    if cfg.stage.name == "single":
        raise ConfigError("name the stage whose runs the workspace shows: stage=<name> (e.g. stage=1)")
    spec = panels_spec(cfg)
    if cfg.logger.mode != "online":
        print(f"W&B workspace for stage {cfg.stage.name} (project {cfg.logger.project}), not saved (offline):")
        for section, keys in spec.items():
            print(f"  section {section!r}: {', '.join(keys)} against step")
        print(f"  runs: config stage.name == {cfg.stage.name!r}, grouped by model.d_model, model.n_loops")
        print(
            "To create it: sync the offline runs (wandb sync <runs>/<stage>/*/wandb/offline-run-*), then rerun with "
            "logger.mode=online logger.entity=<you> and WANDB_API_KEY set."
        )
        return
    if not os.environ.get("WANDB_API_KEY"):
        raise ConfigError("logger.mode=online needs WANDB_API_KEY; or leave logger.mode=offline to print the plan")
    import wandb

    entity = cfg.logger.entity or wandb.Api().default_entity
    workspace = build_workspace(cfg, entity).save()
    print(f"saved W&B workspace: {workspace.url}")


def main(argv: list[str] | None = None) -> None:
    run_cli(dashboard, USAGE, argv)


if __name__ == "__main__":
    main()
