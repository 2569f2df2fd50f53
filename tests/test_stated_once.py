"""Each recipe value is stated once: where a group's files state a key (conf/model, conf/trainer, conf/data,
conf/logger), its schema dataclass gives it no default (MISSING, as for a launcher's settings:
conf/launcher/*.yaml), so changing the recipe is one edit and no default silently disagrees with its file. A
schema default stays where some file of the group leaves the key to it (data.train_tokens: None, the whole
stream), as long as no file repeats it."""

from __future__ import annotations

from dataclasses import MISSING as NO_DEFAULT
from dataclasses import Field, fields, is_dataclass
from typing import Any

import pytest
from omegaconf import MISSING, OmegaConf

from cart_sweeps.config import CONF_DIR, DataConfig, LoggerConfig, ModelConfig, TrainerConfig

# The groups whose files state a recipe, by their schema. The scale group is left out: a scale's file
# (@package _global_) overrides values on purpose, and names them as the paper's numbers it changes.
GROUPS = {"model": ModelConfig, "trainer": TrainerConfig, "data": DataConfig, "logger": LoggerConfig}


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not NO_DEFAULT else f.default


def stated_twice(schema: type, files: dict[str, dict[str, Any]], path: str) -> list[str]:
    """The keys of a group's `files` (name -> content) whose value is stated twice: a file repeats the schema's
    default, or every file states the key, so the default is never read. Nested schemas (data.tokenizer) are
    walked; a list of records (data.sources) states each item whole and is not."""
    twice = []
    for f in fields(schema):
        stating = {name: node[f.name] for name, node in files.items() if f.name in node}
        default = _default(f)
        if not stating or default is MISSING:
            continue
        if is_dataclass(default) and all(isinstance(v, dict) for v in stating.values()):
            twice += stated_twice(type(default), stating, f"{path}.{f.name}")
        elif len(stating) == len(files) or default in stating.values():
            twice.append(f"{path}.{f.name} (schema default {default!r}; stated in {', '.join(stating)})")
    return twice


@pytest.mark.parametrize("group", GROUPS)
def test_a_value_a_group_file_states_has_no_schema_default(group: str) -> None:
    files = {p.name: OmegaConf.to_container(OmegaConf.load(p)) for p in sorted((CONF_DIR / group).glob("*.yaml"))}
    twice = stated_twice(GROUPS[group], files, group)  # type: ignore[arg-type]
    assert not twice, f"conf/{group}/ states values its schema also defaults (make them MISSING there): {twice}"


def test_the_check_sees_a_value_stated_twice() -> None:
    """The rule's own check: a default stated again in a file (cart.yaml's n_prelude, as it was) is found, and a
    key every file states beside a default (the tokenizer's end token) too."""
    cart, dense = {"n_prelude": 6}, {"n_layers": 4}
    assert stated_twice(ModelConfig, {"cart.yaml": cart, "dense.yaml": dense}, "model") == [
        "model.n_prelude (schema default 6; stated in cart.yaml)"
    ]
    files = {n: {"tokenizer": {"eos_token": "<e>"}} for n in ("a.yaml", "b.yaml")}
    assert stated_twice(DataConfig, files, "data") == [
        "data.tokenizer.eos_token (schema default '</s>'; stated in a.yaml, b.yaml)"
    ]
