"""Documents -> token streams (pulled lazily) -> uint16 bins: BOS + ids + EOS per document, cut into chunks."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm


def encode_documents(
    batches: Iterable[list[str]], tok: Tokenizer, bos: int, eos: int
) -> Iterator[tuple[np.ndarray, int]]:
    """(BOS + ids + EOS as uint16, UTF-8 bytes of the text) per document."""
    for texts in batches:
        for text, enc in zip(texts, tok.encode_batch(texts, add_special_tokens=False), strict=True):
            ids = np.empty(len(enc.ids) + 2, dtype=np.uint16)
            ids[0], ids[1:-1], ids[-1] = bos, enc.ids, eos
            yield ids, len(text.encode("utf-8"))


class TokenStream:
    """One source's documents as a single token stream, read in pieces of any length."""

    def __init__(self, docs: Iterator[tuple[np.ndarray, int]]) -> None:
        self._docs = docs
        self._buf: list[np.ndarray] = []
        self._buffered = 0
        self.documents = 0  # documents pulled so far (the last may be partly used)
        self.doc_tokens = 0  # their tokens, BOS and EOS included
        self.doc_bytes = 0  # their UTF-8 bytes

    def _fill(self, n: int) -> None:
        while self._buffered < n:
            doc = next(self._docs, None)
            if doc is None:
                return
            ids, nbytes = doc
            self._buf.append(ids)
            self._buffered += len(ids)
            self.documents += 1
            self.doc_tokens += len(ids)
            self.doc_bytes += nbytes

    def take(self, n: int, partial: bool = False) -> np.ndarray | None:
        """The next `n` tokens; None if the source ends first (or, with `partial`, what is left)."""
        self._fill(n)
        if self._buffered < n and not (partial and self._buffered):
            return None
        flat = np.concatenate(self._buf) if len(self._buf) > 1 else self._buf[0]
        out, rest = flat[:n], flat[n:]
        self._buf, self._buffered = ([rest] if len(rest) else []), len(rest)
        return out


class BinWriter:
    """Append uint16 tokens to a file, counting them and hashing the bytes on the way."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tokens = 0
        self._sha = hashlib.sha256()
        self._file = path.open("wb")

    def write(self, ids: np.ndarray) -> None:
        raw = ids.astype(np.uint16, copy=False).tobytes()
        self._file.write(raw)
        self._sha.update(raw)
        self.tokens += len(ids)

    def summary(self) -> dict[str, str | int]:
        return {"file": self.path.name, "tokens": self.tokens, "sha256": self._sha.hexdigest()}

    def __enter__(self) -> BinWriter:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._file.close()


def interleave(
    streams: dict[str, TokenStream],
    chunks_per_cycle: dict[str, int],
    chunk_tokens: int,
    max_tokens: int | None,
    out: BinWriter,
    bar: tqdm,
) -> dict[str, int]:
    """Write chunks cycling through the sources (e.g. tiny x3, wiki x3, fw x4) until a source cannot fill
    a whole chunk or `max_tokens` is reached (the last chunk then cut to fit); tokens taken per source."""
    taken = dict.fromkeys(streams, 0)
    schedule = [name for name, k in chunks_per_cycle.items() for _ in range(k)]
    for name in itertools.cycle(schedule):
        n = chunk_tokens if max_tokens is None else min(chunk_tokens, max_tokens - out.tokens)
        chunk = streams[name].take(n) if n > 0 else None
        if chunk is None:
            break
        out.write(chunk)
        taken[name] += n
        bar.update(n)
    return taken
