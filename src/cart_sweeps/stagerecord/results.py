"""Where each run's result is, and so where it stands: its own folder, the one its ledger names, another stage's
folder holding the same run, or a folder of another name; a run is what names its place (`Placed`)."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from optuna.trial import FrozenTrial

from cart_sweeps.record.runfolder import read_summary
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.stagerecord.ledger import status_of
from cart_sweeps.stagerecord.runset import recorded_folder
from cart_sweeps.stagerecord.standing import Standing, stand

LOCK = ".driver.lock"  # a stage folder's lock: held by its one driver (plan reads it: a driver runs now)


class Placed(Protocol):
    """A run as its place names it (sweep/expand.py's Run is one)."""

    @property
    def run_id(self) -> str: ...

    @property
    def run_dir(self) -> Path: ...


@dataclass(frozen=True)
class Held:
    """A run's result and its folder: `owner`, the other stage's whose it is (a run is trained once, its id has no
    stage); `scanned`, not named by the ledger yet; `moved`, under another name, to be put back from."""

    summary: RunSummary
    folder: Path
    owner: str | None = None
    scanned: bool = False
    moved: bool = False


def _held(
    run: Placed, folder: Path, summary: RunSummary | None, scanned: bool = False, moved: bool = False
) -> Held | None:
    """The run's result in `folder`, whose summary the caller read, else None."""
    if summary is None or summary.run_id != run.run_id or not summary.is_result:
        return None
    owner = folder.parent.name if folder.parent != run.run_dir.parent and not moved else None
    return Held(summary, folder, owner, scanned, moved)


class Results:
    """Where runs' results are (see the module); other folders are read once, at the first run that needs them:
    a relaunch of a finished stage reads none."""

    def __init__(self) -> None:
        # keyed by folders' text, not Paths: a Path's parent and hash cost more than the rest of a 100,000-run look-up
        self._by_id8: dict[str, dict[str, list[Path]]] = {}  # per runs root: id[:8] -> run folders
        self._by_id: dict[str, dict[str, Path]] = {}  # per stage folder: run id -> a folder holding its result
        self.occupants: dict[str, RunSummary] = {}  # run id -> another run's summary, in the run's own folder
        self._roots: dict[str, str] = {}  # stage folder -> its runs root
        self._listed: dict[str, set[str]] | None = None  # per folder, its folders' names, during `held_each`

    def held_each(self, runs: Sequence[Placed], history: Mapping[str, Sequence[FrozenTrial]]) -> dict[str, Held | None]:
        """`held` of each run (by run id), each folder listed once: no summary is read where no folder is (a fresh
        100,000-run stage opened 200,000 missing files)."""
        self._listed = {}
        try:
            return {run.run_id: self.held(run, history.get(run.run_id, [])) for run in runs}
        finally:
            self._listed = None

    def _summary(self, folder: Path, parent: str, name: str) -> RunSummary | None:
        """`folder`'s summary (`parent`, `name`: its path split), read only where `held_each`'s listing shows it."""
        if self._listed is not None:
            if (names := self._listed.get(parent)) is None:
                names = self._listed[parent] = _names_in(Path(parent))
            if name not in names:
                return None
        return read_summary(folder)

    def held(self, run: Placed, trials: Sequence[FrozenTrial] = ()) -> Held | None:
        """The run's result, where it is (the ledger alone is not the result); None when no folder holds it.
        A run labelled before its stage's labels showed every key the stage varies keeps its folder."""
        stage_dir, name = os.path.split(run.run_dir)
        own = self._summary(run.run_dir, stage_dir, name)  # read once: the run's result, or a run occupying its folder
        if held := _held(run, run.run_dir, own):
            return held
        if trials:
            named = recorded_folder(Path(stage_dir).parent, os.path.basename(stage_dir), trials[-1].user_attrs)
            if named != run.run_dir and (held := _held(run, named, self._summary(named, *os.path.split(named)))):
                return held
        if own is not None and own.run_id != run.run_id:
            self.occupants[run.run_id] = own
        if trials and not status_of(trials[-1]).is_result:  # running or to retry: its own to train
            return None
        return self._trained_elsewhere(run, stage_dir) or self._moved(run, stage_dir)

    def trained_since(self, run: Placed) -> Held | None:
        """The run's result in another stage's folder, looked for afresh: one that stage trained during this
        launch (it held the run's claim, sweep/claims.py)."""
        stage_dir = os.path.dirname(run.run_dir)
        self._by_id8.pop(os.path.dirname(stage_dir), None)
        return self._trained_elsewhere(run, stage_dir)

    def _trained_elsewhere(self, run: Placed, stage_dir: str) -> Held | None:
        return next(
            (h for f in self._elsewhere(run, stage_dir) if (h := _held(run, f, read_summary(f), scanned=True))), None
        )

    def _elsewhere(self, run: Placed, stage_dir: str) -> list[Path]:
        """Other stages' folders named for the run's id (`<root>/<stage>/<label>-<id8>`), in path order."""
        if (root := self._roots.get(stage_dir)) is None:
            root = self._roots[stage_dir] = os.path.dirname(stage_dir)
        if root not in self._by_id8:
            found: dict[str, list[Path]] = defaultdict(list)
            for folder in (f for stage in _folders_in(Path(root)) for f in _folders_in(stage)):
                found[folder.name.rsplit("-", 1)[-1]].append(folder)
            self._by_id8[root] = found
        return [f for f in self._by_id8[root].get(run.run_id[:8], []) if str(f.parent) != stage_dir]

    def _moved(self, run: Placed, stage_dir: str) -> Held | None:
        """The run's result in a folder of its stage or of the runs root under another name (`mv RUN mine`)."""
        if stage_dir not in self._by_id:
            found: dict[str, Path] = {}
            for folder in (*_folders_in(Path(stage_dir)), *_folders_in(Path(stage_dir).parent)):
                if (summary := read_summary(folder)) is not None and summary.run_id and summary.is_result:
                    found.setdefault(summary.run_id, folder)
            self._by_id[stage_dir] = found
        moved = self._by_id[stage_dir].get(run.run_id)
        return _held(run, moved, read_summary(moved), moved=True) if moved is not None else None


def _folders_in(path: Path) -> list[Path]:
    return sorted(path / name for name in _names_in(path))


def _names_in(path: Path) -> set[str]:
    try:
        return {e.name for e in os.scandir(path) if e.is_dir()}
    except OSError:
        return set()


def standing(
    run: Placed, trials: Sequence[FrozenTrial], held: Held | None, occupant: RunSummary | None = None
) -> Standing:
    """Where `run` stands, from its trials, `Results.held` and `Results.occupants`."""
    scanned, moved = (held.scanned, held.moved) if held is not None else (False, False)
    return stand(trials[-1] if trials else None, held is not None, scanned, moved, occupant is not None)
