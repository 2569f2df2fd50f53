"""Prepare a data recipe once: tokenizer, train.bin, val_<set>.bin and manifest.json in its cache folder. One
preparer builds under a file lock in a temporary folder renamed into place when complete; the others wait.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import datasets
import tokenizers
from filelock import FileLock
from omegaconf import DictConfig
from tokenizers import Tokenizer
from tqdm import tqdm

from cart_sweeps.config import DataConfig
from cart_sweeps.data.errors import DataError
from cart_sweeps.data.manifest import MANIFEST, TOKENIZER
from cart_sweeps.data.recipe import as_config, recipe_content, recipe_dir, recipe_hash
from cart_sweeps.data.sources import hub_revision, iter_texts
from cart_sweeps.data.tokenizer import check_fits_uint16, check_vocab, load_hub, special_ids, train_bpe
from cart_sweeps.data.tokens import BinWriter, TokenStream, encode_documents, interleave

log = logging.getLogger(__name__)

_NAME = re.compile(r"^\w+$")


def check_recipe(cfg: DictConfig) -> None:
    r = cfg.name
    if cfg.tokenizer.kind not in ("hub", "bpe"):
        raise DataError(f"data={r}: data.tokenizer.kind={cfg.tokenizer.kind!r} is not allowed; use hub or bpe")
    check_fits_uint16(cfg.tokenizer.vocab_size, r)
    if not cfg.sources:
        raise DataError(f"data={r}: the recipe has no sources; list them under data.sources")
    if cfg.chunk_tokens < 1 or (cfg.train_tokens is not None and cfg.train_tokens < 1):
        raise DataError(f"data={r}: data.chunk_tokens and data.train_tokens must be >= 1")
    for group, specs in (("sources", cfg.sources), ("validation", cfg.validation)):
        names = [s.name for s in specs]
        bad = [n for n in names if not _NAME.match(n)] or sorted({n for n in names if names.count(n) > 1})
        if bad:
            raise DataError(f"data={r}: data.{group} names must be unique words (letters, digits, _): {bad}")
    for s in cfg.sources:
        if s.chunks_per_cycle < 1:
            raise DataError(f"data={r}: source '{s.name}' needs chunks_per_cycle >= 1")
    for v in cfg.validation:
        if v.n_tokens < 1:
            raise DataError(f"data={r}: validation set '{v.name}' needs n_tokens >= 1")


def _training_text(cfg: DictConfig) -> Iterator[str]:
    for src in cfg.sources:
        for texts in iter_texts(src, cfg.streaming, cfg.name, max_docs=cfg.tokenizer.train_docs):
            yield from texts


def make_tokenizer(cfg: DictConfig) -> tuple[Tokenizer, str | None]:
    """The tokenizer, and the hub commit it came from (None for a BPE trained here)."""
    if cfg.tokenizer.kind == "hub":
        return load_hub(cfg.tokenizer, cfg.name)
    log.info("data=%s: training a %d-token byte-level BPE on the training sources", cfg.name, cfg.tokenizer.vocab_size)
    return train_bpe(cfg.tokenizer, _training_text(cfg)), None


def _bar(desc: str, total: int | None) -> tqdm:
    return tqdm(total=total, desc=desc, unit="tok", unit_scale=True, disable=None, leave=False)


def write_train(cfg: DictConfig, tok: Tokenizer, bos: int, eos: int, folder: Path) -> dict[str, Any]:
    streams = {
        s.name: TokenStream(encode_documents(iter_texts(s, cfg.streaming, cfg.name), tok, bos, eos))
        for s in cfg.sources
    }
    with BinWriter(folder / "train.bin") as out, _bar(f"{cfg.name} train", cfg.train_tokens) as bar:
        per_source = {s.name: s.chunks_per_cycle for s in cfg.sources}
        taken = interleave(streams, per_source, cfg.chunk_tokens, cfg.train_tokens, out, bar)
    if out.tokens == 0:
        raise DataError(
            f"data={cfg.name}: a source holds less than one chunk of {cfg.chunk_tokens} tokens; "
            "add text or lower data.chunk_tokens"
        )
    if cfg.train_tokens is not None and out.tokens < cfg.train_tokens:
        log.warning(
            "data=%s: train.bin has %d tokens, short of train_tokens=%d (a source ran out)",
            cfg.name,
            out.tokens,
            cfg.train_tokens,
        )
    return {
        **out.summary(),
        "tokens_per_source": taken,
        "documents_per_source": {name: s.documents for name, s in streams.items()},
    }


def write_val(cfg: DictConfig, spec: DictConfig, tok: Tokenizer, bos: int, eos: int, folder: Path) -> dict[str, Any]:
    """The first `n_tokens` of the set; bytes per token over the documents it drew on (for bits per byte)."""
    stream = TokenStream(encode_documents(iter_texts(spec, cfg.streaming, cfg.name), tok, bos, eos))
    with BinWriter(folder / f"val_{spec.name}.bin") as out, _bar(f"{cfg.name} val {spec.name}", spec.n_tokens) as bar:
        ids = stream.take(spec.n_tokens, partial=True)
        if ids is None:
            raise DataError(f"data={cfg.name}: validation set '{spec.name}' has no documents; check its source")
        out.write(ids)
        bar.update(len(ids))
    if out.tokens < spec.n_tokens:
        log.warning(
            "data=%s: validation set '%s' has only %d of n_tokens=%d tokens",
            cfg.name,
            spec.name,
            out.tokens,
            spec.n_tokens,
        )
    return {
        **out.summary(),
        "documents": stream.documents,
        "bytes": stream.doc_bytes,
        "bytes_per_token": stream.doc_bytes / stream.doc_tokens,
    }


def build(cfg: DictConfig, digest: str, folder: Path) -> dict[str, Any]:
    """Everything of the recipe into `folder`; the manifest is written last."""
    t0 = time.perf_counter()
    tok, tok_revision = make_tokenizer(cfg)
    vocab_size = check_vocab(tok, cfg.tokenizer, cfg.name)
    bos, eos = special_ids(tok, cfg.tokenizer, cfg.name)
    tok.save(str(folder / TOKENIZER))
    train = write_train(cfg, tok, bos, eos, folder)
    val = {v.name: write_val(cfg, v, tok, bos, eos, folder) for v in cfg.validation}
    seconds = time.perf_counter() - t0
    specs = [("source", s) for s in cfg.sources] + [("validation", v) for v in cfg.validation]
    manifest = {
        "recipe": cfg.name,
        "recipe_hash": digest,
        "content": recipe_content(cfg),
        "tokenizer": {
            "kind": cfg.tokenizer.kind,
            "name": cfg.tokenizer.name,
            "file": TOKENIZER,
            "vocab_size": vocab_size,
            "bos_id": bos,
            "eos_id": eos,
            "revision": tok_revision,
        },
        "revisions": {f"{kind}/{spec.name}": hub_revision(spec, cfg.name) for kind, spec in specs},  # None: local
        "chunk_tokens": cfg.chunk_tokens,
        "train": train,
        "validation": val,
        "build_seconds": round(seconds, 2),
        "tokens_per_second": round((train["tokens"] + sum(v["tokens"] for v in val.values())) / seconds),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"datasets": datasets.__version__, "tokenizers": tokenizers.__version__},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def prepare(data_cfg: DictConfig | DataConfig) -> Path:
    """The recipe's prepared folder, building it first if it is not there (once, whatever the concurrency)."""
    cfg = as_config(data_cfg)
    check_recipe(cfg)
    digest = recipe_hash(cfg)
    final = recipe_dir(cfg, digest)
    if (final / MANIFEST).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{final}.lock"):
        if (final / MANIFEST).is_file():
            return final  # another process built it while we waited
        if final.exists():
            raise DataError(f"data={cfg.name}: {final} exists without a manifest; delete it and rerun")
        for stale in final.parent.glob(f".{final.name}.tmp-*"):  # left by a killed preparer
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            manifest = build(cfg, digest, tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info(
        "data=%s: prepared %s in %.1f s (%s tokens/s)",
        cfg.name,
        final,
        manifest["build_seconds"],
        f"{manifest['tokens_per_second']:,}",
    )
    return final
