"""What a run reads: the prepared bins, memory-mapped, addressed by step: as in the author's code (a fixed-order
DataLoader over seq_len-strided windows), no shuffle, every seed sees the same tokens, a resume needs no state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from cart_sweeps.config import DataConfig
from cart_sweeps.data.errors import DataError
from cart_sweeps.data.manifest import TOKENIZER, bins, checked_recipe
from cart_sweeps.data.recipe import as_config, recipe_dir, recipe_hash

log = logging.getLogger(__name__)
_wrapped: set[tuple[int, int, int]] = set()  # (bin length, seq_len, micro-batch) already warned about


@dataclass(frozen=True)
class Prepared:
    """A prepared recipe: its folder, manifest, and uint16 memmaps of train.bin and each val_<set>.bin."""

    folder: Path
    manifest: dict[str, Any]
    train: np.memmap
    val: dict[str, np.memmap]  # validation set name -> tokens, in the recipe's order

    @property
    def vocab_size(self) -> int:
        return self.manifest["tokenizer"]["vocab_size"]

    @property
    def bytes_per_token(self) -> dict[str, float]:
        """Validation set name -> UTF-8 bytes per token of its text, to turn CE into bits per byte."""
        return {name: entry["bytes_per_token"] for name, entry in self.manifest["validation"].items()}

    @property
    def digests(self) -> dict[str, str]:
        """'train' and each validation set -> its bin's sha256 (checked on load): what a run read, in its summary."""
        return {name: entry["sha256"] for name, entry in bins(self.manifest).items()}

    @property
    def tokenizer_path(self) -> Path:
        return self.folder / TOKENIZER


def load_prepared(data_cfg: DictConfig | DataConfig) -> Prepared:
    """Memory-map the recipe's bins (each sha256 checked once per process), preparing them first if needed."""
    cfg = as_config(data_cfg)
    if not recipe_dir(cfg, recipe_hash(cfg)).exists():
        from cart_sweeps.data.prepare import prepare  # imports `datasets` (~1.5 s): only when there is work

        prepare(cfg)
    folder, manifest, paths = checked_recipe(cfg)
    memmaps = {name: np.memmap(path, dtype=np.uint16, mode="r") for name, path in paths.items()}
    train = memmaps.pop("train")
    return Prepared(folder, manifest, train, memmaps)


def train_batch(
    train_tokens: np.ndarray, step: int, micro_step: int, micro_batch_size: int, grad_accum: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), int64 [micro_batch_size, seq_len], of micro-batch `micro_step` of 0-based step `step`:
    micro-batch b = step * grad_accum + micro_step holds windows b * micro_batch_size onwards, window w being
    tokens[w * seq_len : (w + 1) * seq_len + 1]; past the last whole micro-batch the order wraps (logged once)."""
    if not 0 <= micro_step < grad_accum:
        raise ValueError(f"micro_step={micro_step} must be in 0..{grad_accum - 1}")
    n_batches = (len(train_tokens) - 1) // seq_len // micro_batch_size
    if n_batches < 1:
        raise DataError(
            f"train.bin holds {len(train_tokens):,} tokens, too few for one micro-batch of "
            f"{micro_batch_size} x {seq_len + 1}; lower trainer.micro_batch_size or trainer.seq_len"
        )
    batch = step * grad_accum + micro_step
    if batch >= n_batches:
        key = (len(train_tokens), seq_len, micro_batch_size)
        if key not in _wrapped:
            _wrapped.add(key)
            log.warning(
                "train.bin holds %d micro-batches of %d x %d tokens; the run goes past them and the data "
                "order wraps around to the start",
                n_batches,
                micro_batch_size,
                seq_len + 1,
            )
        batch %= n_batches
    starts = (batch * micro_batch_size + np.arange(micro_batch_size)) * seq_len
    rows = torch.from_numpy(np.stack([train_tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def val_windows(val_tokens: np.ndarray, n_windows: int, seq_len: int) -> torch.Tensor:
    """The first `n_windows` windows (int64 [n_windows, seq_len + 1], strided as training's) of a validation bin."""
    available = (len(val_tokens) - 1) // seq_len
    if n_windows > available:
        raise DataError(
            f"a validation bin of {len(val_tokens):,} tokens holds {available} windows of {seq_len + 1} tokens, "
            f"fewer than the {n_windows} asked; lower trainer.eval_windows or raise the set's n_tokens"
        )
    index = np.arange(n_windows)[:, None] * seq_len + np.arange(seq_len + 1)
    return torch.from_numpy(np.asarray(val_tokens[index], dtype=np.int64))
