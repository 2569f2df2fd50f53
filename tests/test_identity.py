"""Run identity: every run id that exists today stays what it is (tests/fixtures/run_ids.json was written
by the code before identity was frozen), and a field added to the schema with a default keeps them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cart_sweeps.compose import compose_config
from cart_sweeps.config import run_id
from cart_sweeps.sweep.expand import Stage

PINNED = Path(__file__).parent / "fixtures" / "run_ids.json"
STAGES = {  # real stage expansions, as `python -m cart_sweeps -m <args>` launches them
    "stage1_tiny": ["stage=1", "scale=tiny"],
    "stage1_paper": ["stage=1"],
    "stage2_tiny": ["stage=2", "scale=tiny"],
    "stage2_paper": ["stage=2"],
    "stage2_corrected": ["stage=2", "scale=tiny", "trainer.decay_all=false", "model.core_update=paper"],
    "parity_tiny": ["stage=parity", "scale=tiny"],
    "parity_paper": ["stage=parity"],
    "ablations_tiny": ["stage=ablations", "scale=tiny"],
    "ablations_paper": ["stage=ablations"],
}
SINGLES = {  # single runs, as `python -m cart_sweeps <args>` composes them
    "default": [],
    "tiny": ["scale=tiny"],
    "tiny_r8": ["scale=tiny", "model.n_loops=8", "trainer.steps=200"],
    "dense": ["model=dense"],
    "tiny_bpe_docs": ["scale=tiny", "data.tokenizer.train_docs=100", "seed=7"],
}


def _stage_ids(args: list[str]) -> dict[str, str]:
    return {run.label: run.run_id for run in Stage(args).runs}


def current_ids(source: Path) -> dict[str, dict[str, str]]:
    """The run ids the code gives now: each stage's runs, single runs, variable R from `source`, a search point."""
    ids = {name: _stage_ids(args) for name, args in STAGES.items()}
    ids["single"] = {name: run_id(compose_config(args)) for name, args in SINGLES.items()}
    source.mkdir(exist_ok=True)
    OmegaConf.save(compose_config(["scale=tiny", "stage=2"]), source / "config.yaml", resolve=True)
    ids["variable_r"] = _stage_ids(["stage=variable_r", "scale=tiny", f"stage.source={source}"])
    search = Stage(["stage=lr", "scale=tiny", "sweep.sampler=tpe", "sweep.n_trials=2"])
    ids["lr_search"] = {str(lr): search.run({"trainer.lr": lr}).run_id for lr in (1e-4, 1e-3)}
    return ids


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A trained run's folder as variable_r reads it (its config.yaml only)."""
    return tmp_path_factory.mktemp("source") / "d48-P6-R6-s42"


def test_todays_run_ids_never_change(source):
    assert current_ids(source) == json.loads(PINNED.read_text())
