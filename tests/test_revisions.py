"""A recipe pins the hub revision of each source and of the tokenizer; the manifest records what was read."""

from __future__ import annotations

import datasets
import huggingface_hub
import pytest
from omegaconf import OmegaConf

from cart_sweeps.compose import compose_config
from cart_sweeps.data.errors import DataError
from cart_sweeps.data.loader import load_prepared
from cart_sweeps.data.recipe import recipe_hash
from cart_sweeps.data.sources import hub_revision, iter_texts
from cart_sweeps.data.tokenizer import load_hub
from cart_sweeps.identity import run_id


def test_a_pinned_revision_reaches_datasets(monkeypatch):
    """The real `datasets` read of a shipped file, with the call's arguments recorded on the way."""
    seen, real = [], datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    spec = compose_config(["scale=tiny", "data.validation.2.revision=0123abc"]).data.validation[2]
    texts = next(iter_texts(spec, streaming=False, recipe="embedded"))
    assert texts and seen[-1]["revision"] == "0123abc"
    assert hub_revision(spec, "embedded") is None  # local files have no hub commit


def test_a_pinned_tokenizer_revision_reaches_the_hub_client(monkeypatch):
    seen = []

    def offline(*args, **kwargs):
        seen.append(kwargs)
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    tcfg = OmegaConf.create({"name": "NousResearch/Llama-2-7b-hf", "revision": "v1.0"})
    with pytest.raises(DataError, match="cannot fetch tokenizer"):
        load_hub(tcfg, "paper_mix")
    assert seen[-1]["revision"] == "v1.0"


def test_unpinned_recipes_keep_their_hash_and_a_pin_makes_a_new_one():
    data = compose_config(["scale=tiny"]).data
    plain = OmegaConf.to_container(data)
    for spec in [plain["tokenizer"], *plain["sources"], *plain["validation"]]:
        del spec["revision"]  # the recipe as it was before revisions existed
    assert recipe_hash(OmegaConf.create(plain)) == recipe_hash(data)
    assert recipe_hash(compose_config(["scale=tiny", "data.sources.0.revision=main"]).data) != recipe_hash(data)


def test_the_manifest_records_every_source_revision(data_cache):
    manifest = load_prepared(compose_config(["scale=tiny"]).data).manifest
    names = ("shakespeare", "bible", "austen")
    assert manifest["revisions"] == {f"{kind}/{n}": None for kind in ("source", "validation") for n in names}
    assert manifest["tokenizer"]["revision"] is None  # a BPE trained here


def test_a_config_read_back_from_its_run_folder_keeps_its_run_id(tmp_path):
    """config.yaml is untyped when read back: the later fields (revision) must still drop out at their defaults."""
    cfg = compose_config(["scale=tiny", "stage=variable_r", "stage.eval_n_loops=2", "stage.num_fewshot=5"])
    OmegaConf.save(cfg, tmp_path / "config.yaml", resolve=True)
    assert run_id(OmegaConf.load(tmp_path / "config.yaml")) == run_id(cfg)
