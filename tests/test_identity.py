"""Run identity: every run id that exists today stays what it is (tests/fixtures/run_ids.json was written
by the code before identity was frozen), and a field added to the schema with a default keeps them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cart_sweeps import composer, register
from cart_sweeps.compose import compose_config
from cart_sweeps.config import (
    Config,
    DataConfig,
    ModelConfig,
    SourceConfig,
    TokenizerConfig,
    TrainerConfig,
    ValSetConfig,
)
from cart_sweeps.identity import FROZEN_FIELDS, config_id, later_defaults, run_id
from cart_sweeps.record.runfolder import checkpoint_path
from cart_sweeps.sweep.expand import Stage

PINNED = Path(__file__).parent / "fixtures" / "run_ids.json"
# The paper-scale runs pinned here trained torch AdamW, the paper scale's default until AdamW8bit (the
# author's optimizer) took its place: those same runs, named explicitly, keep their ids.
ADAMW = "trainer.optimizer=adamw"
# The tiny runs of the Stage-2 recipe pinned here accumulated 4 micro-batches of 2, until scale=tiny folded them
# into one micro-batch of 8 (the same windows, 1.2x faster): named explicitly, those runs keep their ids.
UNFOLDED = "scale.fold_accumulation=false"
# The tiny stage runs pinned here ran 40 steps (Stage 1's recipe) and 80 (Stage 2's) until scale=tiny halved
# them (issue 26: the demo in minutes): named explicitly, those runs keep their ids.
LONGER = "scale.steps={3000:40,30500:80}"
# The tiny runs of the Stage-2 recipe pinned "halved" ran 40 steps until scale=tiny cut them to 30 (issue 26: the
# demo within 10 minutes): named explicitly, those runs keep their ids.
HALVED = "scale.steps={3000:20,30500:40}"
STAGES = {  # real stage expansions, as `python -m cart_sweeps -m <args>` launches them
    "stage1_tiny": ["stage=1", "scale=tiny", LONGER],
    "stage1_tiny_halved": ["stage=1", "scale=tiny"],
    "stage1_paper": ["stage=1", ADAMW],
    "stage2_tiny": ["stage=2", "scale=tiny", UNFOLDED, LONGER],
    "stage2_tiny_folded": ["stage=2", "scale=tiny", LONGER],
    "stage2_tiny_halved": ["stage=2", "scale=tiny", HALVED],
    "stage2_tiny_30_steps": ["stage=2", "scale=tiny"],
    "stage2_paper": ["stage=2", ADAMW],
    "stage2_corrected": [
        "stage=2",
        "scale=tiny",
        "trainer.decay_all=false",
        "model.core_update=paper",
        UNFOLDED,
        LONGER,
    ],
    "parity_tiny": ["stage=parity", "scale=tiny", UNFOLDED, LONGER],
    "parity_tiny_halved": ["stage=parity", "scale=tiny", HALVED],
    "parity_tiny_30_steps": ["stage=parity", "scale=tiny"],
    "parity_paper": ["stage=parity", ADAMW],
    "ablations_tiny": ["stage=ablations", "scale=tiny", UNFOLDED, LONGER],
    "ablations_tiny_folded": ["stage=ablations", "scale=tiny", LONGER],
    "ablations_tiny_halved": ["stage=ablations", "scale=tiny", HALVED],
    "ablations_tiny_30_steps": ["stage=ablations", "scale=tiny"],
    "ablations_paper": ["stage=ablations", ADAMW],
}
SINGLES = {  # single runs, as `python -m cart_sweeps <args>` composes them
    "default": [ADAMW],
    "tiny": ["scale=tiny"],
    "tiny_r8": ["scale=tiny", "model.n_loops=8", "trainer.steps=200"],
    "dense": ["model=dense", ADAMW],
    "tiny_bpe_docs": ["scale=tiny", "data.tokenizer.train_docs=100", "seed=7"],
}


def _stage_ids(args: list[str]) -> dict[str, str]:
    return {run.label: run.run_id for run in Stage(args).runs}


def current_ids(source: Path) -> dict[str, dict[str, str]]:
    """The run ids the code gives now: each stage's runs, single runs, variable R from `source`, a search point."""
    ids = {name: _stage_ids(args) for name, args in STAGES.items()}
    ids["single"] = {name: run_id(compose_config(args)) for name, args in SINGLES.items()}
    completed_source(source)
    ids["variable_r"] = _stage_ids(["stage=variable_r", "scale=tiny", f"stage.source={source}"])
    search = Stage(["stage=lr", "scale=tiny", "sweep.sampler=tpe", "sweep.n_trials=2", LONGER])
    ids["lr_search"] = {str(lr): search.run({"trainer.lr": lr}).run_id for lr in (3e-4, 1e-3)}
    return ids


def completed_source(source: Path) -> None:
    """A trained run's folder as variable_r reads it: its config.yaml, a summary saying completed, and the
    final checkpoint (fixed bytes: its digest is part of the evaluations' ids)."""
    source.mkdir(exist_ok=True)
    cfg = compose_config(["scale=tiny", "stage=2"])
    OmegaConf.save(cfg, source / "config.yaml", resolve=True)
    final = checkpoint_path(source, cfg.trainer.steps)
    final.parent.mkdir(exist_ok=True)
    final.write_bytes(b"the final checkpoint")
    summary = {"status": "completed", "run_id": run_id(cfg), "step": cfg.trainer.steps}
    (source / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A trained run's folder as variable_r reads it."""
    return tmp_path_factory.mktemp("source") / "d48-P6-R6-s42"


def test_todays_run_ids_never_change(source):
    assert current_ids(source) == json.loads(PINNED.read_text())


@dataclass
class SourceWithRevision(SourceConfig):
    revision: str | None = None


@dataclass
class DataWithRevision(DataConfig):
    sources: list[SourceWithRevision] = field(default_factory=list)


@dataclass
class ModelWithSwitch(ModelConfig):
    new_switch: bool = False


@dataclass
class TrainerWithOption(TrainerConfig):
    new_option: float = 0.0


@dataclass
class ConfigWithNewFields(Config):
    model: ModelWithSwitch = field(default_factory=ModelWithSwitch)
    data: DataWithRevision = field(default_factory=DataWithRevision)
    trainer: TrainerWithOption = field(default_factory=TrainerWithOption)


@pytest.fixture
def new_fields(monkeypatch):
    """The schema as it would be after someone adds a field with a default to model, trainer and a data source."""
    monkeypatch.setattr(register, "Config", ConfigWithNewFields)  # the schema Hydra is given
    monkeypatch.setattr(composer, "_BASES", {})  # bases composed with this schema stay out of the process's cache
    register.register_configs.cache_clear()  # registered once per process: again with this schema
    yield
    register.register_configs.cache_clear()  # and again with the real one (monkeypatch has restored it)


@pytest.mark.slow
def test_a_field_added_with_its_default_keeps_every_run_id(new_fields, source):
    assert "new_switch" in compose_config(["scale=tiny"]).model  # the added fields are really there
    assert "revision" in compose_config(["scale=tiny"]).data.sources[0]
    assert current_ids(source) == json.loads(PINNED.read_text())


def test_a_field_added_and_set_makes_a_new_run(new_fields):
    before = run_id(compose_config(["scale=tiny"]))
    assert run_id(compose_config(["scale=tiny", "model.new_switch=true"])) != before
    assert run_id(compose_config(["scale=tiny", "trainer.new_option=0.5"])) != before
    cfg = compose_config(["scale=tiny"])
    cfg.data.sources[0].revision = "v2"
    assert run_id(cfg) != before


# Fields added to a schema since identity was frozen, with their defaults.
LATER_DEFAULTS: dict[str, dict[str, object]] = {
    "TrainerConfig": {
        "keep_final_optimizer": False,
        "schedule": "cosine",
        "decay_fraction": 0.2,
        "decay_shape": "sqrt",
        "keep_checkpoints_at": [],
        "branch_from": None,
        "branch_step": None,
    },
    "TokenizerConfig": {"revision": None},
    "SourceConfig": {"revision": None},
    "ValSetConfig": {"revision": None},
}


def test_later_fields_keep_their_defaults():
    """A later field's default is what its runs' ids leave out: changing it would give existing ids a new meaning."""
    schemas = (ModelConfig, DataConfig, TokenizerConfig, SourceConfig, ValSetConfig, TrainerConfig)
    assert set(FROZEN_FIELDS) == {s.__name__ for s in schemas}
    for schema in schemas:
        assert FROZEN_FIELDS[schema.__name__] <= {f.name for f in fields(schema)}, f"{schema.__name__} lost a field"
    found = {s.__name__: d for s in schemas if (d := later_defaults(s))}
    assert found == LATER_DEFAULTS, (
        "a schema field added since run identity was frozen is new here, or its default changed. "
        "A new field: pin its default in LATER_DEFAULTS. A changed default: put the old default back and "
        "make the new behaviour a new value (or a new field), since runs with the old default keep their ids; "
        "never add the field to FROZEN_FIELDS, which would change every run id"
    )


@pytest.mark.parametrize(
    "change", ["trainer.lr=1e-3", "model.d_model=48", "data.sources.0.path=text", "data.validation.1.n_tokens=9"]
)
def test_changing_a_value_makes_a_new_run(change):
    assert run_id(compose_config(["scale=tiny", change])) != run_id(compose_config(["scale=tiny"]))


def test_seeds_share_the_config_id():
    one, two, other = (compose_config(["scale=tiny", *args]) for args in (["seed=1"], ["seed=2"], ["trainer.lr=1e-3"]))
    assert run_id(one) != run_id(two) and config_id(one) == config_id(two)
    assert config_id(other) != config_id(one)
