"""The analysis's output folder, written whole or not at all (docs/results.md): built beside OUT and swapped in;
OUT/.analysis-files names what it wrote, so the next one removes what it no longer writes and keeps the rest."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import AnalysisError

MANIFEST = ".analysis-files"  # in OUT: the names the analysis wrote, one a line
PARTIAL = ".analysis-partial"  # in a folder still being built
AT_FDCWD, RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>


@contextmanager
def replacing(out: Path, keep: bool = False) -> Iterator[Path]:
    """An empty folder that replaces `out` when the block ends without an error (`keep`, for --only: what an
    earlier analysis wrote and this one does not is kept); a file system's refusal is one line: AnalysisError."""
    out = out.resolve()  # a symlinked OUT is replaced where it points
    with _refused(f"cannot write the analysis to {out}", "it is left as it was"):
        _check(out)
        for leftover in (_beside(out, "old"), _beside(out, "new")):
            _settle(leftover, out)
        new = _beside(out, "new")
        new.mkdir()
        (new / PARTIAL).touch()
        try:
            yield new
            if keep:
                _carry_written(out, new)
            (new / MANIFEST).write_text("".join(f"{p.name}\n" for p in sorted(new.iterdir()) if p.name != PARTIAL))
            (new / PARTIAL).unlink()
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        if not out.exists():
            new.rename(out)
            return
        old = _exchange(new, out)
    with _refused(f"the new analysis is in {out}, but {old} still holds what it did not write", "run again"):
        _settle(old, out)


@contextmanager
def _refused(what: str, then: str) -> Iterator[None]:
    """A file system's error in the block as one line: `what` (the error); `then`. Found also behind an error
    raised while handling it (matplotlib's PDF writer, on a full disk, fails so)."""
    try:
        yield
    except Exception as err:
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__context__
        if isinstance(err, AnalysisError) or not isinstance(cause, OSError):
            raise
        why = f"{cause.strerror}: {cause.filename}" if cause.filename else (cause.strerror or str(cause))
        raise AnalysisError(f"{what} ({why}); {then}") from err


def _check(out: Path) -> None:
    """Refuse, before anything is built, an OUT the analysis cannot replace."""
    if out.exists() and not out.is_dir():
        raise AnalysisError(f"--out {out} is a file, not a folder")
    if os.path.ismount(out):
        raise AnalysisError(
            f"--out {out} is a mount point: the analysis replaces its folder whole; give a folder in it"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    for folder in (out.parent, out):
        if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):  # a read-only mount refuses root too
            raise AnalysisError(f"cannot write the analysis to {out}: {folder} is read-only or not yours")


def _beside(out: Path, what: str) -> Path:
    return out.with_name(f".{out.name}.analysis-{what}")


def _settle(leftover: Path, out: Path) -> None:
    """Finish what a stopped analysis left beside `out`: a half-built folder goes; a whole one (swapped out, or
    built and not swapped in) first gives `out` the files the analysis did not write, or becomes `out` if none is."""
    if not leftover.exists():
        return
    if not (leftover / PARTIAL).exists():
        if not out.exists():  # stopped between two renames: this is the last whole analysis
            leftover.rename(out)
            return
        ours = {MANIFEST, *_manifest(leftover)}
        for entry in leftover.iterdir():
            if entry.name not in ours and not os.path.lexists(out / entry.name):
                entry.rename(out / entry.name)
    shutil.rmtree(leftover)


def _carry_written(out: Path, new: Path) -> None:
    """Copy into `new` the files an earlier analysis wrote in `out` that `new` does not hold: they stay its own."""
    for name in _manifest(out) if out.is_dir() else []:
        if (out / name).is_file() and not os.path.lexists(new / name):
            shutil.copy2(out / name, new / name)


def _manifest(folder: Path) -> list[str]:
    """The names an analysis wrote in `folder` (none known where it kept no manifest: an older version's output)."""
    path = folder / MANIFEST
    return path.read_text().splitlines() if path.exists() else []


def _exchange(new: Path, out: Path) -> Path:
    """Swap `new` in for `out`, in one step where the system can; returns where the previous folder now is."""
    if sys.platform == "linux" and (renameat2 := getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)):
        if renameat2(AT_FDCWD, os.fsencode(new), AT_FDCWD, os.fsencode(out), RENAME_EXCHANGE) == 0:
            return new
        if (code := ctypes.get_errno()) not in (errno.EINVAL, errno.ENOSYS):  # EINVAL: the file system cannot
            raise OSError(code, os.strerror(code), str(out))
    old = _beside(out, "old")  # two renames: a stop between them leaves no OUT until the next run settles `old`
    out.rename(old)
    new.rename(out)
    return old
