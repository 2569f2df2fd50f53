"""`python -m cart_sweeps.dashboard stage=<name> [overrides]`: the stage's W&B workspace and report (USAGE)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from cart_sweeps.compose import compose_config, run_cli
from cart_sweeps.config import ConfigError
from cart_sweeps.metric import RHO_LABEL
from cart_sweeps.stagerecord.runset import StageRecord
from cart_sweeps.train.logger import check_credentials

USAGE = """usage: python -m cart_sweeps.dashboard stage=<name> [OVERRIDE ...]

Builds the W&B workspace of a stage (panels: train/loss, train/lr, train/tokens_per_s, val/ppl_<set> and
val/bpb_<set> for each validation set, rho, against step; runs filtered to the stage and grouped by
the keys the stage varies, width and R before it ran) and a W&B report with those panels and the stage's tables;
writes both as <runs>/<stage>/wandb_dashboard.json, and saves them to W&B when online.
  python -m cart_sweeps.dashboard stage=1                                  # offline: the spec file only
  python -m cart_sweeps.dashboard stage=1 logger.mode=online logger.entity=ME   # after `wandb login`
"""


def panels_spec(cfg: DictConfig) -> dict[str, list[str]]:
    """Section name -> the metric keys plotted in it (the keys the trainer logs to W&B)."""
    sets = [v.name for v in cfg.data.validation]
    return {
        "Training": ["train/loss"],
        "Learning rate": ["train/lr"],
        "Throughput": ["train/tokens_per_s"],
        "Validation perplexity": [f"val/ppl_{name}" for name in sets],
        "Validation bits per byte": [f"val/bpb_{name}" for name in sets],
        RHO_LABEL: ["rho"],
    }


def group_keys(cfg: DictConfig) -> list[str]:
    """The config keys runs are grouped by: what the stage varies, the seed aside (width and R before it ran)."""
    record = StageRecord.read(Path(cfg.paths.runs) / cfg.stage.name)
    keys = [k for k in record.varied if k not in ("seed", "variant")] if record else []
    keys = [k if "." in k else f"{k}.name" for k in keys]  # a group chosen per run (model=cart,dense): by its name
    return keys or ["model.d_model", "model.n_loops"]


def stage_tables(cfg: DictConfig) -> dict[str, pd.DataFrame]:
    """The analysis tables that read this stage (its own, and the paper's of its role), as the analysis writes them."""
    from cart_sweeps.analysis import recipe
    from cart_sweeps.analysis import stage_tables as own
    from cart_sweeps.analysis.load import AnalysisError, load_runs, pick_metric
    from cart_sweeps.analysis.registry import TABLES
    from cart_sweeps.analysis.report import stages_read

    try:
        study = load_runs(Path(cfg.paths.runs))
        metric, _ = pick_metric(study.final(), cfg.sweep.metric if cfg.sweep.metric in study.evals else None)
    except AnalysisError:
        return {}
    final = study.final()
    stage = str(cfg.stage.name)

    def own_table(part: recipe.Part) -> pd.DataFrame:
        return own.stage_table(part.rows(final), stage, study.axes[stage], metric)

    def paper_table(name: str) -> Callable[[recipe.Part], pd.DataFrame]:
        return lambda part: TABLES[name].of(part.study(study), part.rows(final), metric)

    builds: dict[str, Callable[[recipe.Part], pd.DataFrame]] = (
        {f"{own.PREFIX}{stage}": own_table} if stage in study.axes else {}
    )
    builds |= {name: paper_table(name) for name, table in TABLES.items() if cfg.stage.role in table.reads}
    tables = {}
    for name, build in builds.items():
        try:
            tables[name], _ = recipe.apart(recipe.parts(study, stages_read(final, name)), build)
        except AnalysisError:  # the stage's runs so far do not give this table
            continue
    return tables


SPEC = "wandb_dashboard.json"  # in the stage's folder


def title(cfg: DictConfig) -> str:
    return f"CART stage {cfg.stage.name} ({cfg.scale.name})"


def dashboard_spec(cfg: DictConfig, entity: str | None, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """The workspace and report as plain data, written to the stage's folder where W&B cannot be reached."""
    from cart_sweeps.analysis.render import markdown

    spec = panels_spec(cfg)
    runs = {"filter": {"config.stage.name": cfg.stage.name}, "groupby": [f"config.{k}" for k in group_keys(cfg)]}
    return {
        "entity": entity,
        "project": cfg.logger.project,
        "workspace": {"name": title(cfg), "sections": spec, "x": "step", "runs": runs},
        "report": {
            "title": title(cfg),
            "panels": [key for keys in spec.values() for key in keys],
            "runs": runs,
            "tables": {name: markdown(table) for name, table in tables.items()},
        },
    }


def build_report(cfg: DictConfig, entity: str, tables: dict[str, pd.DataFrame]) -> Any:
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    from cart_sweeps.analysis.render import markdown

    runs = wr.Runset(
        entity=entity,
        project=cfg.logger.project,
        name=f"stage {cfg.stage.name}",
        filters=[ws.Config("stage.name") == cfg.stage.name],
        groupby=[f"config.{k}" for k in group_keys(cfg)],
    )
    plots: list[wr.interface.PanelTypes]  # PanelGrid takes any panel kind
    plots = [wr.LinePlot(title=key, x="Step", y=[key]) for keys in panels_spec(cfg).values() for key in keys]
    blocks: list[Any] = [wr.PanelGrid(runsets=[runs], panels=plots)]
    for name, table in tables.items():
        blocks += [wr.H2(name), wr.MarkdownBlock(text=markdown(table))]
    return wr.Report(
        project=cfg.logger.project,
        entity=entity,
        title=title(cfg),
        description=f"Runs of stage {cfg.stage.name} and the tables the analysis builds from them.",
        blocks=blocks,
    )


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
        name=title(cfg),
        sections=sections,
        runset_settings=ws.RunsetSettings(
            filters=[ws.Config("stage.name") == cfg.stage.name],
            groupby=[ws.Config(k) for k in group_keys(cfg)],
        ),
    )


def dashboard(overrides: list[str]) -> Path:
    """Write the stage's dashboard spec (and save it to W&B when online); the spec file's path."""
    cfg = compose_config(overrides)
    if cfg.stage.name == "single":
        raise ConfigError("name the stage whose runs the workspace shows: stage=<name> (e.g. stage=1)")
    online = cfg.logger.mode == "online"
    entity = cfg.logger.entity
    if online:
        check_credentials(cfg.logger, used=True)
        import wandb

        entity = entity or wandb.Api().default_entity
        assert entity is not None  # check_credentials passed: the API knows the login's entity
    tables = stage_tables(cfg)
    spec = dashboard_spec(cfg, entity, tables)
    path = Path(cfg.paths.runs) / cfg.stage.name / SPEC
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=2) + "\n")
    print(f"W&B workspace for stage {cfg.stage.name} (project {cfg.logger.project}){'' if online else ', offline'}:")
    for section, keys in spec["workspace"]["sections"].items():
        print(f"  section {section!r}: {', '.join(keys)} against step")
    print(f"  runs: config stage.name == {cfg.stage.name!r}, grouped by {', '.join(group_keys(cfg))}")
    names = ", ".join(tables) or f"none yet in {cfg.paths.runs}"
    print(f"W&B report: those panels and the stage's tables: {names}")
    print(f"spec written to {path}")
    if not online:
        print(
            "not saved to W&B (offline). To save it: sync the runs (wandb sync <runs>/<stage>/*/wandb/offline-run-*; "
            "runs trained with logger=none: python -m cart_sweeps.wandb_sync backfill stage=<name> first), then rerun "
            "this with logger.mode=online logger.entity=<you> after `wandb login` (or with WANDB_API_KEY)."
        )
        return path
    assert entity is not None
    workspace = build_workspace(cfg, entity).save()
    print(f"saved W&B workspace: {workspace.url}")
    report = build_report(cfg, entity, tables).save()
    print(f"saved W&B report: {report.url}")
    return path


def main(argv: list[str] | None = None) -> None:
    run_cli(dashboard, USAGE, argv)


if __name__ == "__main__":
    main()
