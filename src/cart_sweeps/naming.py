"""A run's names for people and for the file system: its ablation variant, its label, its folder (`run_dir`:
the resolver hydra.run.dir reads)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from cart_sweeps.config import ABLATION_SWITCHES, ConfigError, ModelConfig
from cart_sweeps.identity import run_id
from cart_sweeps.modelspec import SHAPE_KEYS, spec_of
from cart_sweeps.options import CoreUpdate


def variant(model: DictConfig | ModelConfig) -> str:
    """The ablation label of a model config: 'base', or its switches joined by '+'."""
    on = [s for s in ABLATION_SWITCHES if getattr(model, s)]
    if model.core_update != CoreUpdate.reference:
        on.append(f"core_{model.core_update}")
    return "+".join(on) or "base"


# The override keys `run_label` shows in its fixed part; any other key a stage varies is appended to it.
LABEL_SHOWS = frozenset(
    {"seed", "model", "model.name", "model.d_model", "model.core_update", "stage.eval_n_loops", "stage.num_fewshot"}
    | {f"model.{key}" for key in (*SHAPE_KEYS, *ABLATION_SWITCHES)}
)
SHORT_KEYS = {"weight_decay": "wd", "warmup_steps": "warmup", "micro_batch_size": "mbs", "grad_accum": "accum"}


def short_value(value: Any) -> str:
    """A value as a label writes it: 3e-3, 0.5, 32, true; a list's items joined by _ (0.9_0.95)."""
    if isinstance(value, float) and value != 0 and not 1e-2 <= abs(value) < 1e4:
        mantissa, exponent = f"{value:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, DictConfig | dict):  # a config group chosen per run (data=...): its name; else its items
        return str(value["name"]) if "name" in value else "_".join(f"{k!s}{short_value(v)}" for k, v in value.items())
    if isinstance(value, ListConfig | list | tuple):
        return "_".join(short_value(v) for v in value) or "none"
    return str(value)


def _numbers(value: Any) -> bool:
    """Whether a label writes `value` right after its key (lr3e-3, betas0.9_0.95), not after an _."""
    if isinstance(value, ListConfig | list | tuple):
        return bool(value) and all(_numbers(v) for v in value)
    return isinstance(value, int | float) and not isinstance(value, bool)


def axis_tag(key: str, value: Any) -> str:
    """One varied key in a label: lr3e-3, betas0.9_0.95, decay_all_false; a path separator becomes `_`."""
    name = key.rsplit(".", 1)[-1]
    name = SHORT_KEYS.get(name, name)
    tag = f"{name}{short_value(value)}" if _numbers(value) else f"{name}_{short_value(value)}"
    return tag.replace("/", "_").replace("\\", "_")


def run_label(cfg: DictConfig) -> str:
    """A short human label: d256-P6-R8-s42, dense-d1024-L7-s42, d1024-P6-R6-disable_lti-s42, d256-P6-R6-s42-at-R6;
    each other key its stage varies is shown before the seed (d32-P2-R2-lr3e-3-s42)."""
    return seeded_label(label_parts(cfg), cfg.seed)


def model_parts(m: DictConfig) -> list[str]:
    """The model's part of a label, piece by piece (W&B's tags): [dense, d1024, L7] or [d256, P6, R8(, variant)]."""
    spec = spec_of(m)
    return [*spec.parts(m), *([variant(m)] if spec.ablations and variant(m) != "base" else [])]


def label_parts(cfg: DictConfig) -> tuple[str, str]:
    """`run_label` around its seed: what comes before `-s<seed>` and after."""
    before = "-".join(model_parts(cfg.model))
    for key in cfg.stage.get("varied") or ():
        if key not in LABEL_SHOWS:
            before += f"-{axis_tag(key, OmegaConf.select(cfg, key))}"
    after = ""
    if cfg.stage.eval_n_loops is not None:
        after += f"-at-R{cfg.stage.eval_n_loops}"
    if cfg.stage.get("num_fewshot") is not None:
        after += f"-{cfg.stage.num_fewshot}shot"
    return before, after


# A run folder `<label>-<id8>` is one file name: at most 255 bytes on Linux's, macOS's and Windows' file systems.
LABEL_BYTES = 255 - len("-") - 8


def seeded_label(parts: tuple[str, str], seed: int) -> str:
    """`run_label` from its parts. A label too long for a folder name keeps its seed and end, its start cut short
    with a hash of the whole start: two configs that differ past the cut still differ."""
    start, end = parts[0], f"-s{seed}{parts[1]}"
    if len(start.encode()) + len(end.encode()) <= LABEL_BYTES:
        return start + end
    digest = hashlib.sha256(start.encode()).hexdigest()[:8]
    room = LABEL_BYTES - len(end.encode()) - len(f"-{digest}")
    return f"{start.encode()[:room].decode(errors='ignore')}-{digest}{end}"


def run_dir(cfg: DictConfig) -> Path:
    """A run's folder, `<paths.runs>/<stage>/<label>-<run id[:8]>`, for a single run and a stage's alike."""
    return run_folder(stage_folder(cfg), run_label(cfg), run_id(cfg))


STAGE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def check_stage_name(name: str, key: str = "stage.name") -> str:
    """`name`, if safe as a stage's folder and study name (`~` sets a study's digest apart in a shared storage)."""
    if not STAGE_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(
            f"{key}={name}: a stage's name is its folder under paths.runs and its study's name: "
            "use at most 128 letters, digits, '-', '_' and '.' (not '.' or '..' alone)"
        )
    return name


def stage_folder(cfg: DictConfig) -> Path:
    return Path(cfg.paths.runs) / cfg.stage.name


def runs_of_named_stage(cfg: DictConfig, purpose: str) -> Path:
    """The folder of the stage `cfg` names, for a command that reads its runs (to `purpose` them)."""
    if cfg.stage.name == "single":
        raise ConfigError(f"name the stage whose runs to {purpose}: stage=<name> (e.g. stage=1)")
    if not (stage_dir := stage_folder(cfg)).is_dir():
        raise ConfigError(f"stage {cfg.stage.name} has no runs in {stage_dir}; launch it first, or set paths.runs")
    return stage_dir


def run_folder(stage_dir: Path, label: str, id_: str) -> Path:
    """`run_dir` from the run's stage folder, label and id, for a caller that has them (hashing is not free)."""
    return stage_dir / f"{label}-{id_[:8]}"
