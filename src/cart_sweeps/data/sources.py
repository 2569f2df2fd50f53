"""Read one text source (a training source or a validation set) through `datasets`, in a fixed order: the hub
and local files by the same code; empty documents skipped, as in the author's build script."""

from __future__ import annotations

import random
from collections.abc import Iterator

import datasets
from omegaconf import DictConfig

from cart_sweeps.data.errors import DataError
from cart_sweeps.data.recipe import LOCAL_BUILDERS, hub_offline, resolve_dir

BATCH_DOCS = 256  # documents handed to the tokenizer at once


def _open_error(spec: DictConfig, recipe: str, err: Exception) -> DataError:
    where = f"{spec.path}" + (f" ({', '.join(spec.data_files)})" if spec.data_files else "")
    if spec.path in LOCAL_BUILDERS:
        fix = "check its data_files and data_dir"
    elif hub_offline():
        fix = (
            "the hub is off (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set): use data=embedded, or run "
            f"`python -m cart_sweeps.data.prepare data={recipe}` where the hub is reachable"
        )
    else:
        fix = f"check the network and the dataset name, or use data=embedded ({type(err).__name__})"
    return DataError(f"data={recipe}: cannot open source '{spec.name}' from {where}: {fix}")


def _load(spec: DictConfig, streaming: bool, recipe: str) -> datasets.Dataset | datasets.IterableDataset:
    try:
        return datasets.load_dataset(
            spec.path,
            name=spec.config_name,
            split=spec.split,
            data_files=list(spec.data_files) if spec.data_files else None,
            data_dir=resolve_dir(spec.data_dir),
            revision=spec.get("revision"),
            streaming=streaming,
        )
    except OSError as e:  # ConnectionError offline, FileNotFoundError for a missing file or dataset
        raise _open_error(spec, recipe, e) from None
    except ValueError as e:  # e.g. a split or config the dataset does not have
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"data={recipe}: cannot open source '{spec.name}' ({spec.path}): {reason}") from None


def hub_revision(spec: DictConfig, recipe: str) -> str | None:
    """The commit sha of the hub dataset a source reads (its `revision` resolved); None for local files."""
    if spec.path in LOCAL_BUILDERS:
        return None
    try:
        return datasets.load_dataset_builder(spec.path, name=spec.config_name, revision=spec.get("revision")).hash
    except OSError as e:
        raise _open_error(spec, recipe, e) from None


def document_order(n_docs: int, last_docs: int | None, shuffle_seed: int | None) -> list[int]:
    """Row order of a validation set: optionally its last N documents, then optionally shuffled the way
    the author's build script did (random.Random(seed).shuffle of the row indices)."""
    order = list(range(max(0, n_docs - last_docs) if last_docs else 0, n_docs))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    return order


def iter_texts(spec: DictConfig, streaming: bool, recipe: str, max_docs: int | None = None) -> Iterator[list[str]]:
    """Batches of non-empty document texts, in the source's order (or the validation set's order)."""
    reorder = spec.get("last_docs") is not None or spec.get("shuffle_seed") is not None
    ds = _load(spec, streaming and not reorder, recipe)
    if reorder:
        ds = ds.select(document_order(len(ds), spec.last_docs, spec.shuffle_seed))
    if max_docs is not None:
        ds = ds.take(max_docs)
    for batch in ds.iter(batch_size=BATCH_DOCS):
        if spec.text_field not in batch:
            raise DataError(
                f"data={recipe}: source '{spec.name}' has no field '{spec.text_field}' (it has {list(batch)}); "
                "set its text_field"
            )
        texts = [t for t in batch[spec.text_field] if t and t.strip()]
        if texts:
            yield texts
