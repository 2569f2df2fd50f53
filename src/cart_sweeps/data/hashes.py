"""A file's sha256, and the same kept per version of the file for the life of a process."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@functools.cache
def _sha256(path: Path, device: int, inode: int, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def stored_sha256(path: Path) -> str:
    """`file_sha256(path)`, hashed once per process per version of the file (a bin of 1B tokens takes seconds)."""
    st = path.stat()
    return _sha256(path.resolve(), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
