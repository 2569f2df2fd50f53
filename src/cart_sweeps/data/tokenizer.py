"""The recipe's tokenizer: a pretrained one from the hub, or a byte-level BPE trained on the sources, saved next
to the bins either way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

from omegaconf import DictConfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cart_sweeps.data.errors import DataError
from cart_sweeps.data.recipe import hub_offline

UINT16_VOCAB = 1 << 16  # token ids are stored as uint16
MIN_FREQUENCY = 2  # a merge must occur at least twice, so a BPE never memorises one-off strings


def check_fits_uint16(vocab_size: int, recipe: str) -> None:
    if vocab_size > UINT16_VOCAB:
        raise DataError(
            f"data={recipe}: a vocabulary of {vocab_size:,} does not fit the uint16 bins "
            f"(at most {UINT16_VOCAB:,}); use data.tokenizer.vocab_size<={UINT16_VOCAB}"
        )


def load_hub(tcfg: DictConfig, recipe: str) -> tuple[Tokenizer, str]:
    """The pretrained `tokenizer.json` of a hub model at its pinned `revision` (the HF cache and
    HF_HUB_OFFLINE are honoured), and the commit sha it came from (its snapshot folder's name)."""
    from huggingface_hub import hf_hub_download

    try:
        path = Path(
            hf_hub_download(tcfg.name, "tokenizer.json", revision=tcfg.get("revision"), local_files_only=hub_offline())
        )
        return Tokenizer.from_file(str(path)), path.parent.name
    except OSError as e:
        raise DataError(
            f"data={recipe}: cannot fetch tokenizer {tcfg.name} ({type(e).__name__}); the hub is unreachable "
            f"or offline: use data=embedded, or run `python -m cart_sweeps.data.prepare data={recipe}` "
            "where the hub is reachable and reuse its cache folder"
        ) from None


def train_bpe(tcfg: DictConfig, texts: Iterator[str]) -> Tokenizer:
    """A byte-level BPE (GPT-2 style, no unknown tokens) with BOS/EOS as its first ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tcfg.vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=[tcfg.bos_token, tcfg.eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def special_ids(tok: Tokenizer, tcfg: DictConfig, recipe: str) -> tuple[int, int]:
    """(BOS id, EOS id), each document being wrapped as BOS + ids + EOS."""
    ids = tok.token_to_id(tcfg.bos_token), tok.token_to_id(tcfg.eos_token)
    if None in ids:
        raise DataError(
            f"data={recipe}: tokenizer {tcfg.name} has no {tcfg.bos_token!r}/{tcfg.eos_token!r} token; "
            "set data.tokenizer.bos_token and data.tokenizer.eos_token to its own"
        )
    return cast(tuple[int, int], ids)  # neither is None, checked above


def check_vocab(tok: Tokenizer, tcfg: DictConfig, recipe: str) -> int:
    """The tokenizer's real vocabulary size, after checking it against the recipe and uint16."""
    size = tok.get_vocab_size()
    check_fits_uint16(size, recipe)
    if tcfg.kind == "hub" and size != tcfg.vocab_size:
        raise DataError(
            f"data={recipe}: tokenizer {tcfg.name} has {size:,} tokens, the recipe says {tcfg.vocab_size:,}; "
            f"use data.tokenizer.vocab_size={size}"
        )
    return size
