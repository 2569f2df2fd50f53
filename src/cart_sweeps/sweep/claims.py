"""Which driver trains a run that stages of one runs root share: the one holding its claim.

A run's id leaves out its stage, so two stages launched at once (or one while another trains) would each train
the runs they share. Before a driver trains a run it claims it: a lock file per run id in the runs root, which the
OS frees when its holder dies (kill -9 included), so a killed driver never wedges another. A driver that finds a
run claimed waits for it and references the result the holder leaves (sweep/driver.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock, Timeout

CLAIMS = ".claims"  # the runs root's folder of claims, one `<run id>.lock` each


class Claims:
    """The claims one driver of `stage` holds in the runs root `root`."""

    def __init__(self, root: Path, stage: str) -> None:
        self.folder, self.stage = root / CLAIMS, stage
        self.held: dict[str, FileLock] = {}
        self.reclaimed: set[str] = set()  # held runs a driver claimed before: another stage may have trained them

    def take(self, run_id: str) -> str | None:
        """Claim the run (or keep the claim held already); None when claimed, else who holds it ("stage a (pid 12)")."""
        if run_id in self.held:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{run_id}.lock"
        before = path.exists()
        lock = FileLock(path, on_acquired=self._record)  # on_acquired also rules out filelock's soft (pid) fallback
        try:
            lock.acquire(timeout=0)
        except Timeout:
            try:
                holder = path.read_text().strip()
            except OSError:
                holder = ""
            return holder or "another stage"  # an empty file: its holder is starting
        self.held[run_id] = lock
        if before:
            self.reclaimed.add(run_id)
        return None

    def _record(self, fd: int) -> None:
        """Who holds the claim, for the waiting driver's line: the stage, and its driver's pid."""
        os.ftruncate(fd, 0)
        os.write(fd, f"stage {self.stage} (pid {os.getpid()})".encode())

    def release(self, run_id: str) -> None:
        self.reclaimed.discard(run_id)
        if (lock := self.held.pop(run_id, None)) is not None:
            lock.release()

    def release_all(self) -> None:
        for run_id in list(self.held):
            self.release(run_id)
