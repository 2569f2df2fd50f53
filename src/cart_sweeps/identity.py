"""A run's identity: the config values that define what it computes, and the hashes that name it.

The run id keys a run in the ledger and names its folder, so it must not move when the schema grows: the
fields each schema had when identity was frozen (FROZEN_FIELDS) are always hashed; a field added later only
when it differs from its default (tests/test_identity.py guards those defaults).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from omegaconf import DictConfig, ListConfig, OmegaConf

from cart_sweeps.config import OPERATIONAL, DataConfig, ModelConfig, TrainerConfig, keys_with
from cart_sweeps.options import StageKind

GROUPS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "trainer": TrainerConfig}  # what a run computes
# Its keys that change where or how fast a run goes, not what it computes (config.OPERATIONAL): left out.
NON_IDENTITY_KEYS = {group: frozenset(keys_with(schema, OPERATIONAL)) for group, schema in GROUPS.items()}


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Never edit: the fields of each schema dataclass (by class name) when identity was frozen.
FROZEN_FIELDS: dict[str, frozenset[str]] = {
    "ModelConfig": _names(
        "name d_model head_dim n_prelude n_loops n_layers vocab_size max_seq_len norm_eps rope_base init_std gate_init"
        " core_update unfreeze_kv unshare_core self_attn_core disable_hyper disable_lti disable_lie"
    ),
    "DataConfig": _names("name cache_dir tokenizer sources validation chunk_tokens train_tokens streaming"),
    "TokenizerConfig": _names("kind name vocab_size bos_token eos_token train_docs"),
    "SourceConfig": _names("name path config_name split data_files data_dir text_field chunks_per_cycle"),
    "ValSetConfig": _names(
        "name path config_name split data_files data_dir text_field last_docs shuffle_seed n_tokens"
    ),
    "TrainerConfig": _names(
        "steps seq_len micro_batch_size grad_accum optimizer lr min_lr warmup_steps betas weight_decay decay_all"
        " grad_clip precision compile device threads deterministic eval_every eval_windows eval_batch_size log_every"
        " ckpt_every keep_checkpoints"
    ),
}


def frozen_fields(schema: type) -> frozenset[str] | None:
    """The frozen fields of a schema dataclass (or of the frozen class it extends); None for other types."""
    return next((FROZEN_FIELDS[c.__name__] for c in schema.__mro__ if c.__name__ in FROZEN_FIELDS), None)


@functools.cache
def later_defaults(schema: type) -> dict[str, Any]:
    """The fields of `schema` added since identity was frozen, with their defaults as a config holds them."""
    frozen = frozen_fields(schema) or frozenset()
    defaults = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(schema), resolve=False))
    return {k: v for k, v in defaults.items() if k not in frozen}


def _holds_default(node: DictConfig, key: str, value: Any, default: Any) -> bool:
    """Whether a later field still holds its default as written: compared unresolved where resolving
    could change it (an interpolation, a container), else by its resolved value (the same thing, cheaper)."""
    if isinstance(value, dict | list):
        value = OmegaConf.to_container(node[key], resolve=False)
    elif OmegaConf.is_interpolation(node, key):
        value = cast(dict[str, Any], OmegaConf.to_container(node, resolve=False))[key]
    return value == default


def _defining(node: Any, resolved: Any) -> Any:
    """`resolved` (the node's values) without the later fields that still hold their defaults, at any depth
    (on the stage expansion's hot path: it reads the unresolved config only where it must)."""
    if isinstance(node, ListConfig):
        return [_defining(n, r) for n, r in zip(node, resolved, strict=True)]
    if not isinstance(node, DictConfig):
        return resolved
    schema: type | None = OmegaConf.get_type(node)
    frozen = frozen_fields(schema) if schema is not None else None
    if schema is None or frozen is None:
        return resolved
    later = later_defaults(schema)
    return {
        k: _defining(node[k], v) if isinstance(v, dict | list) else v
        for k, v in resolved.items()
        if k in frozen or not _holds_default(node, k, v, later[k])
    }


def _typed(group: str, node: DictConfig) -> DictConfig:
    """A group read back from a run's config.yaml (untyped) on its schema again, so its later fields are known."""
    if OmegaConf.get_type(node) is not dict:
        return node
    return cast(DictConfig, OmegaConf.merge(OmegaConf.structured(GROUPS[group]), node))


def group_identity(group: str, node: DictConfig) -> dict[str, Any]:
    """One group's part of a run's identity: its defining values, less those that change only where or how fast."""
    node = _typed(group, node)
    values = _defining(node, OmegaConf.to_container(node, resolve=True))
    return {k: v for k, v in values.items() if k not in NON_IDENTITY_KEYS[group]}


GroupPart = Callable[[str, DictConfig], dict[str, Any]]


def identity(cfg: DictConfig, seed: bool = True, part: GroupPart = group_identity) -> dict[str, Any]:
    """The meaning-bearing part of a run's config: model, data recipe, training recipe, seed (unless not asked);
    `part` gives each group's part (`group_identity`, or a composer's memo of it)."""
    out: dict[str, Any] = {"seed": cfg.seed} if seed else {}
    out |= {group: part(group, cfg[group]) for group in GROUPS}
    if cfg.stage.eval_n_loops is not None:  # an evaluation of a trained run at another R
        out["eval_n_loops"] = cfg.stage.eval_n_loops
    if cfg.stage.get("num_fewshot") is not None:  # a benchmark evaluation with lm-eval's few-shot examples
        out["num_fewshot"] = cfg.stage.num_fewshot
    if StageKind.of(cfg).reads_checkpoint:  # which checkpoint it read, and what it measured of it
        evaluated = cfg.get("evaluated")  # None until with_source has read the source
        out["evaluated"] = OmegaConf.to_container(evaluated, resolve=True) if evaluated is not None else None
        out["harness"] = {"tasks": list(cfg.harness.tasks), "limit": cfg.harness.limit}
    return out


def digest(values: dict[str, Any]) -> str:
    return _hash(json.dumps(values, sort_keys=True, default=str))


def _hash(blob: str) -> str:
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


_SEED_MARK = '"seed": "\\u0000seed"'  # the seed's place in a configuration's JSON: no config value writes it


@dataclass(frozen=True)
class SeededIds:
    """The run ids of one configuration's seeds: `digest({**identity, "seed": seed})` with the configuration's
    JSON written once around the seed's place (a 10,240-run stage wrote it 10,240 times: ~1.5 s)."""

    head: str
    tail: str | None  # None: the mark is not there once (a config value holds its very text): ids write it whole
    identity: dict[str, Any]

    @classmethod
    def of(cls, config_identity: dict[str, Any]) -> SeededIds:
        blob = json.dumps({**config_identity, "seed": "\0seed"}, sort_keys=True, default=str)
        head, _, tail = blob.partition(_SEED_MARK)
        return cls(head, tail if blob.count(_SEED_MARK) == 1 else None, config_identity)

    def __call__(self, seed: int) -> str:
        if self.tail is None:
            return digest({**self.identity, "seed": seed})
        text = str(seed) if type(seed) is int else json.dumps(seed)  # an int's JSON is its str: no encoder per run
        return _hash(f'{self.head}"seed": {text}{self.tail}')


def run_id(cfg: DictConfig, part: GroupPart = group_identity) -> str:
    """A short stable hash of `identity(cfg)`: the ledger's key for a run."""
    return SeededIds.of(identity(cfg, seed=False, part=part))(cfg.seed)


def config_id(cfg: DictConfig) -> str:
    """The hash of the identity without the seed: what the seeds of one configuration share."""
    return digest(identity(cfg, seed=False))
