"""The ledger of a stage: an Optuna study stored in the stage's sweep folder.

Every attempt at a run is one trial: its params the run's grid point (paper numbers), its user attrs who the run
is and how it ended, its values the sweep metric(s), its intermediate values that metric at each evaluation.
Results are written the moment a run ends, so a killed driver loses nothing; a trial still RUNNING when a
driver starts was cut off, and is resumed.

A study's value means one thing (its `objective` attr): a launch with another metric or recipe opens a study of
its own beside it (`<stage>~<digest>`, docs/results.md). Nothing is ordered by a clock (hosts' clocks disagree,
docs/faults.md): each launch takes a number, one more than any of its stage's, and its trials carry it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import heapq
import json
import os
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy.exc
from filelock import FileLock
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, Trial, TrialState, create_trial

from cart_sweeps.adapters.optuna import database_of, end_trial, optuna_tables, study_storage, transaction
from cart_sweeps.compose import parse_overrides
from cart_sweeps.config import ConfigError
from cart_sweeps.metric import DEFAULT, metric
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.stagerecord.trials import all_trials
from cart_sweeps.status import RunStatus
from cart_sweeps.text import first_line

# What a damaged ledger file raises inside Optuna (checked with optuna 5.0: an empty or overwritten
# SQLite file gives StorageInternalError; a torn journal JSONDecodeError, a garbage one AssertionError).
DAMAGED = (optuna.exceptions.OptunaError, sqlalchemy.exc.SQLAlchemyError, ValueError, AssertionError)
LAUNCHES = "launches"  # study user attr: what each launch asked for (see Ledger.record_launch)
NUMBER = "number"  # a launch's number in its stage (Ledger.record_launch): what orders launches
AS_BEFORE = "run_ids_as_before"  # a stored launch that stands for the runs of the launch before it (_compact)
LAUNCH = "launch"  # trial user attr: the number of the launch that started the trial (Ledger.record_launch)
# trial user attr, in place of run_id: a search trial whose sampled params are a run the ledger already holds, the
# run's id; it takes that run's result (no second run), and no reader counts it as an attempt at the run
REPEAT = "repeat_of"
NOT_COMPARABLE = "not_comparable"  # trial user attr: the objective a completed run has no value of (Ledger.finish)
OBJECTIVE = "objective"  # study user attr: {"metric": ..., "recipe": ...}, what the study's values mean
LEDGER_FILES = {"sqlite": "ledger.db", "journal": "ledger.journal"}


class LedgerDamaged(ConfigError):
    """A stage's ledger file does not open; the next launch rebuilds it from the run folders."""


class LedgerUnwritable(ConfigError):
    """The disk under a stage's ledger is full or read-only: no write can succeed until that is fixed."""


_UNWRITABLE = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system"}
_SQLITE_UNWRITABLE = {"database or disk is full": "disk full", "readonly database": "read-only file system"}


def unwritable(err: BaseException) -> str | None:
    """Why a ledger operation failed when the disk is the cause (Optuna's own message, 'invalid data in the
    commit', hides it): found in the exception's chain of causes."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _UNWRITABLE:
            return _UNWRITABLE[seen.errno]
        why = next((v for k, v in _SQLITE_UNWRITABLE.items() if k in str(seen)), None)
        if why:
            return why
        seen = seen.__cause__ or seen.__context__
    return None


@contextlib.contextmanager
def writing(path: Path | None) -> Iterator[None]:
    """Ledger writes in the block: a full or read-only disk under `path` is one line (LedgerUnwritable)."""
    try:
        yield
    except LedgerUnwritable:
        raise
    except (*DAMAGED, OSError) as err:
        if (why := unwritable(err)) and path is not None:
            raise LedgerUnwritable(
                f"ledger {path} cannot be written ({why} at {path.parent}): free space or make it writable, "
                "then relaunch (what is recorded is kept)"
            ) from err
        raise


def shared(storage: str) -> bool:
    """Whether `sweep.storage` names a storage several stages share (a SQLite file, an RDB URL), one study
    per stage, rather than the stage's own ledger file (sqlite, journal)."""
    return storage not in LEDGER_FILES


def check_storage(storage: str, root: Path) -> str:
    """`sweep.storage` as the ledger opens it, or one line naming the forms. A shared SQLite file (named, or in a
    sqlite:/// URL) is made absolute, a relative one in the runs root `root` (paths.runs), not the working folder:
    two runs roots launched from one folder never share a study unless one absolute file is named for both."""
    if not shared(storage):
        return storage
    if "://" in storage:
        try:
            url = sqlalchemy.engine.make_url(storage)
        except sqlalchemy.exc.ArgumentError as err:
            raise ConfigError(f"sweep.storage={storage}: not a database URL ({first_line(err)})") from err
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return storage
        return url.set(database=_in_root(storage, str(url.database), root)).render_as_string(hide_password=False)
    if Path(storage).suffix not in (".db", ".sqlite", ".sqlite3"):
        raise ConfigError(
            f"sweep.storage={storage}: use sqlite or journal (each stage's own ledger), a SQLite file several "
            "stages share (study.db, in paths.runs), or a database URL (postgresql://...)"
        )
    return _in_root(storage, storage, root)


def _in_root(storage: str, file: str, root: Path) -> str:
    """A shared SQLite file, absolute: a relative one inside the runs root (`..` would let two roots share it)."""
    path = (root / file).resolve()
    if not Path(file).is_absolute() and not path.is_relative_to(root.resolve()):
        raise ConfigError(
            f"sweep.storage={storage} leaves the runs root {root} (a relative file is kept inside it, so two roots "
            "never share a study); name an absolute file to share one on purpose"
        )
    return str(path)


def ledger_path(sweep_dir: Path, storage: str) -> Path | None:
    """The ledger's file: the stage's own, a shared SQLite file, or None for a database URL."""
    if not shared(storage):
        return sweep_dir / LEDGER_FILES[storage]
    return None if "://" in storage else Path(check_storage(storage, sweep_dir.parent))


def sqlite_url(path: Path) -> str:
    """SQLAlchemy's URL of a SQLite file. A path with URL characters would be misread (after a '?' comes a
    query: the ledger would land in another folder, shared by other roots), so it is refused in one line."""
    if bad := next((c for c in "?#" if c in str(path)), None):
        raise ConfigError(
            f"paths.runs: the ledger's folder {path.parent} holds {bad!r}, which SQLite's URL cannot carry; "
            "choose paths.runs without it, or sweep.storage=journal"
        )
    return f"sqlite:///{path}"


def _storage(path: Path | None, kind: str) -> BaseStorage:
    """The ledger's storage; a SQLite file is only ever opened once its schema is whole."""
    if path is None:
        return RDBStorage(kind, engine_kwargs={"pool_pre_ping": True})
    if kind == "journal":
        return JournalStorage(JournalFileBackend(str(path)))
    url = sqlite_url(path)
    if not path.exists():
        _create_sqlite(path)
    return RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}}, skip_table_creation=True)


def _create_sqlite(path: Path) -> None:
    """Build a fresh SQLite ledger beside `path` and link it into place unless one appeared meanwhile.
    Optuna creates its tables check-then-create, so two processes opening a new file at once (a driver
    starting while `plan`, the dashboard or a test polls) make one of them fail: "table already exists"."""
    tmp = path.with_name(f".{path.name}.new{os.getpid()}")
    try:
        fresh = RDBStorage(sqlite_url(tmp))
        fresh.remove_session()
        fresh.engine.dispose()
        with contextlib.suppress(FileExistsError):  # another process made it first: keep theirs
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _create(
    path: Path | None,
    stage: str,
    storage: str,
    sampler: optuna.samplers.BaseSampler | None,
    pruner: optuna.pruners.BasePruner,
    objective: dict[str, Any],
) -> optuna.Study:
    opened = _storage(path, storage)
    name = _study_name(opened, stage, objective)
    # the study's values are these metrics (sweep/objectives.py: several make a multi-objective study)
    directions = [check_direction(m, None) for m in objective.get("metrics") or [objective.get("metric", DEFAULT)]]
    study = optuna.create_study(
        storage=opened, study_name=name, sampler=sampler, pruner=pruner, directions=directions, load_if_exists=True
    )
    if objective and OBJECTIVE not in study.user_attrs:
        study.set_user_attr(OBJECTIVE, objective)
    return study


def check_direction(name: str, direction: str | None) -> Literal["minimize", "maximize"]:
    """The direction of sweep.metric `name`: the metric's own, which every ranking reads; `sweep.direction` may
    say it, never contradict it."""
    found = metric(name)  # none: a study from before objectives named the metric
    own: Literal["minimize", "maximize"] = found.direction if found else "minimize"
    if direction is not None and direction not in ("minimize", "maximize"):
        raise ConfigError(f"sweep.direction={direction}: use minimize or maximize (or leave it out: {name}'s own)")
    if direction is not None and direction != own:
        raise ConfigError(
            f"sweep.direction={direction} contradicts sweep.metric={name}, which is {found.label if found else name}"
            f" and so {own}d; leave sweep.direction out, or rank by a metric that is {direction}d"
        )
    return own


def _study_name(storage: BaseStorage, stage: str, objective: dict[str, Any]) -> str:
    """The stage's study whose values mean `objective`: the first (named `stage`), else `<stage>~<digest>` or an
    earlier `<stage>~...` meaning it too (`trainer.lr=3e-3` as `0.003`); a first study from before objectives
    were recorded means it where its named metric agrees."""
    names = optuna.get_all_study_names(storage)  # names alone: no trial is read
    if not objective or stage not in names:
        return stage
    meaning = _meaning(objective)
    recorded = _objective_of(storage, stage)  # None also while its creator has yet to record it
    if recorded is None and "metrics" not in objective and _named_metric(storage, stage) in (None, objective["metric"]):
        return stage
    if recorded is not None and _meaning(recorded) == meaning:
        return stage
    digest = hashlib.sha256(json.dumps(objective, sort_keys=True, default=str).encode()).hexdigest()[:8]
    named = f"{stage}~{digest}"
    if named in names:
        return named
    alike = (n for n in names if n.startswith(f"{stage}~") and _meaning(_objective_of(storage, n) or {}) == meaning)
    return next(alike, named)


def _objective_of(storage: BaseStorage, name: str) -> dict[str, Any] | None:
    return storage.get_study_user_attrs(storage.get_study_id_from_name(name)).get(OBJECTIVE)


def _meaning(objective: dict[str, Any]) -> dict[str, Any]:
    """An objective with its command-line settings as values, so that two spellings of one value mean one thing."""
    settings = {o.key_or_group: o.value() for o in parse_overrides(objective.get("passed", []))}
    return {**objective, "passed": settings}


def _named_metric(storage: BaseStorage, stage: str) -> str | None:
    names = optuna.load_study(study_name=stage, storage=storage).metric_names
    return names[0] if names else None


def stage_studies(storage: BaseStorage, stage: str) -> list[str]:
    """The names of the stage's studies in `storage`, oldest first (the first is named after the stage)."""
    return [n for n in optuna.get_all_study_names(storage) if _of_stage(n, stage)]


def _of_stage(study_name: str, stage: str) -> bool:
    return study_name == stage or study_name.startswith(f"{stage}~")


_unknown_said: set[tuple[int, str]] = set()  # (trial number, status) already named: one line each


def status_of(trial: FrozenTrial) -> RunStatus:
    """How the attempt stands: none recorded is running or failed; one this version does not know is failed."""
    fallback = RunStatus.RUNNING if trial.state == TrialState.RUNNING else RunStatus.FAILED
    status, unknown = RunStatus.read(trial.user_attrs.get("status", fallback.value), RunStatus.FAILED)
    if unknown and (said := (trial.number, repr(trial.user_attrs["status"]))) not in _unknown_said:
        _unknown_said.add(said)
        label = trial.user_attrs.get("label", f"trial {trial.number}")
        print(f"warning: ledger: {label}: {unknown} (a relaunch runs it again)", file=sys.stderr, flush=True)
    return status


def _one_at_a_time(storage: RDBStorage) -> contextlib.AbstractContextManager[Any]:
    """A SQLite file's launches recorded one at a time, by a lock file: its deferred transaction let two drivers
    read the numbers before either wrote (a race test: 1 run in 3); a server locks a row (`_record_in`)."""
    url = sqlalchemy.engine.make_url(storage.url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return FileLock(f"{url.database}.launch.lock")
    return contextlib.nullcontext()


class Ledger:
    """One study of a stage; trials are grouped by the run id they attempt."""

    def __init__(self, study: optuna.Study, stage: str) -> None:
        self.study, self.stage = study, stage
        self.number: int | None = None  # this launch's, once recorded: the trials it starts carry it

    @functools.cached_property
    def study_id(self) -> int:
        """The study's key in its storage (what a new trial and a trial's number are looked up by)."""
        return study_storage(self.study).get_study_id_from_name(self.study.study_name)

    @classmethod
    def open(
        cls,
        sweep_dir: Path,
        stage: str,
        storage: str,
        sampler: optuna.samplers.BaseSampler | None = None,
        pruner: optuna.pruners.BasePruner | None = None,
        objective: dict[str, Any] | None = None,
    ) -> Ledger:
        """Create or reopen the ledger of `objective` (None: the stage's first study). One that does not open is
        set aside, not deleted, and a fresh one started (the driver records the run folders' results into it)."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = check_storage(storage, sweep_dir.parent)
        path = ledger_path(sweep_dir, storage)
        pruner = pruner or optuna.pruners.NopPruner()
        objective = objective or {}
        try:
            with writing(path):
                study = _create(path, stage, storage, sampler, pruner, objective)
        except LedgerUnwritable:  # a full disk is no damage
            raise
        except DAMAGED as err:
            if path is None or shared(storage):  # a storage other stages share is never set aside
                raise ConfigError(f"sweep.storage={storage} does not open ({first_line(err)})") from err
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            set_aside = path.rename(path.with_name(f"{path.name}.damaged-{stamp}"))
            print(f"ledger {path} does not open ({first_line(err)}); set aside as {set_aside.name}, starting afresh")
            study = _create(path, stage, storage, sampler, pruner, objective)
        return cls(study, stage)

    @classmethod
    def read(cls, sweep_dir: Path, stage: str, storage: str) -> Ledger | None:
        """The stage's first study, or None (never launched; creates nothing); LedgerDamaged: it does not open."""
        return next(iter(cls.read_all(sweep_dir, stage, storage)), None)

    @classmethod
    def read_all(cls, sweep_dir: Path, stage: str, storage: str) -> list[Ledger]:
        """Every study of the stage in its ledger file, oldest first; LedgerDamaged: the file does not open."""
        storage = check_storage(storage, sweep_dir.parent)
        path = ledger_path(sweep_dir, storage)
        if path is not None and not path.exists():
            return []
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            opened = _storage(path, storage)
            return [cls(optuna.load_study(study_name=n, storage=opened), stage) for n in stage_studies(opened, stage)]
        except DAMAGED as err:
            raise LedgerDamaged(
                f"ledger {path} does not open ({first_line(err)}); the next launch of stage {stage} sets it "
                "aside and rebuilds it from the run folders"
            ) from err

    def adopt_queued(self, dists: Callable[[dict[str, Any]], dict[str, BaseDistribution]]) -> None:
        """Start the trials an earlier version's driver queued and died before starting: each is then a cut-off
        attempt, resumed like any other, not a failed one beside its run's next."""
        while waiting := all_trials(self.study, states=(TrialState.WAITING,)):
            self.study.ask(dists(waiting[0].system_attrs["fixed_params"]))  # Optuna pops the oldest first

    def name_objective(self, metrics: list[str]) -> None:
        """Name the study's values after its metrics (optuna-dashboard and `study.metric_names` show them)."""
        with warnings.catch_warnings():  # set_metric_names is marked experimental (optuna 5.0)
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.set_metric_names(metrics)

    def record_launch(self, run_ids: list[str], args: list[str], after: int = 0) -> int:
        """Remember the runs this launch stands for (its whole grid), so the analysis tables each cell from its
        newest launch; returns its number, one more than any of the stage's here and `after` (its other ledger
        files'), taken with the record in one transaction: two drivers never take one number."""
        launch = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "args": list(args), "run_ids": list(run_ids)}
        if (storage := database_of(self.study)) is None:  # a journal file: the stage's own, which its driver locks
            stored = {s.study_name: s.user_attrs.get(LAUNCHES, []) for s in study_storage(self.study).get_all_studies()}
            number, launches = self._append(launch, after, stored)
            self.study.set_user_attr(LAUNCHES, launches)
        else:
            number = self._record_in(storage, launch, after)
        self.number = number
        return number

    def _record_in(self, storage: RDBStorage, launch: dict[str, Any], after: int) -> int:
        """`record_launch` in a database, in one transaction."""
        attr = optuna_tables.StudyUserAttributeModel
        with _one_at_a_time(storage), transaction(storage) as session:
            # a write first: SQLite takes its write lock here, a database server locks the stage's first study's
            # row, so another driver's launch waits for this one's commit before it reads the numbers taken
            study = optuna_tables.StudyModel
            session.query(study).filter(study.study_name == self.stage).update({study.study_name: self.stage})
            named = session.query(study.study_name, attr).join(attr, attr.study_id == study.study_id)
            rows = dict(named.filter(attr.key == LAUNCHES).all())
            number, launches = self._append(launch, after, {n: json.loads(r.value_json) for n, r in rows.items()})
            if (mine := rows.get(self.study.study_name)) is not None:
                mine.value_json = json.dumps(launches)
            else:
                session.add(attr(study_id=self.study_id, key=LAUNCHES, value_json=json.dumps(launches)))
        return number

    def _append(
        self, launch: dict[str, Any], after: int, stored: dict[str, list[dict[str, Any]]]
    ) -> tuple[int, list[dict[str, Any]]]:
        """`launch`'s number, one more than any other of the stage's, and this study's launches to store with it;
        `stored`: each study's launches in the storage, as stored."""
        taken = [n for name, launches in stored.items() if _of_stage(name, self.stage) for n in _numbers(launches)]
        number = max([after, *taken]) + 1
        return number, _compact([*_expanded(stored.get(self.study.study_name, [])), {NUMBER: number, **launch}])

    def add_to_launch(self, run_id: str) -> None:
        """A search sampled a new run during the newest launch."""
        launches = self.launches()
        launches[-1]["run_ids"].append(run_id)
        self.study.set_user_attr(LAUNCHES, _compact(launches))

    def launches(self) -> list[dict[str, Any]]:
        """Every launch of this study, oldest first: {"number", "at", "args", "run_ids"} (no number: an old one)."""
        return _expanded(self.study.user_attrs.get(LAUNCHES, []))

    def repeats(self) -> list[FrozenTrial]:
        """A search's repeat trials (`REPEAT`), oldest first."""
        return [t for t in all_trials(self.study) if REPEAT in t.user_attrs]

    def attempts(self) -> dict[str, list[FrozenTrial]]:
        """Run id -> its trials, oldest first (a repeat is none of them)."""
        out: dict[str, list[FrozenTrial]] = defaultdict(list)
        for trial in all_trials(self.study):
            if "run_id" in trial.user_attrs:
                out[trial.user_attrs["run_id"]].append(trial)
        return dict(out)

    def start(self, params: dict[str, Any], dists: dict[str, BaseDistribution], attrs: dict[str, Any]) -> Trial:
        """A new running trial at fixed params, written whole in one transaction (queueing then asking took six)."""
        user_attrs = {**attrs, **self._launch_attr(), "status": RunStatus.RUNNING.value}
        template = create_trial(state=TrialState.RUNNING, params=params, distributions=dists, user_attrs=user_attrs)
        return Trial(self.study, study_storage(self.study).create_new_trial(self.study_id, template_trial=template))

    def ask(self) -> Trial:
        """A new trial whose params the study's sampler chooses (a search); `tag` it once they are known."""
        return self.study.ask()

    def tag(self, trial: Trial, attrs: dict[str, Any]) -> None:
        """Record a sampled trial's run (or, with `REPEAT`, the run it repeats) and this launch, as running."""
        for key, value in {**attrs, **self._launch_attr(), "status": RunStatus.RUNNING.value}.items():
            trial.set_user_attr(key, value)

    def _launch_attr(self) -> dict[str, int]:
        return {LAUNCH: self.number} if self.number is not None else {}

    def resume(self, trial: FrozenTrial) -> Trial:
        """The live handle of a trial a previous driver left RUNNING."""
        trial_id = study_storage(self.study).get_trial_id_from_study_id_trial_number(self.study_id, trial.number)
        return Trial(self.study, trial_id)

    def finish(self, trial: Trial, summary: RunSummary, metrics: str | list[str]) -> RunStatus:
        """Record how a run ended, now, one value per objective; a completed run without a finite value of each is
        failed: the ledger never holds a result it cannot rank."""
        metrics = [metrics] if isinstance(metrics, str) else metrics
        status, error = summary.status, summary.error
        values = [summary.value(m) for m in metrics]
        missing = next((m for m, v in zip(metrics, values, strict=True) if v is None), None)
        attrs: dict[str, Any] = {}
        if status == RunStatus.COMPLETED and missing is not None and missing not in summary.results():
            attrs[NOT_COMPARABLE] = missing  # a result, never retried, but none Optuna ranks
            print(
                f"warning: {summary.label}: completed, but not comparable under sweep.metrics={metrics}: its summary "
                f"has no {missing} (it was trained under other objectives); left out of this study's ranking, kept as "
                "done (remove its folder to train and measure it again)",
                file=sys.stderr,
                flush=True,
            )
        elif status == RunStatus.COMPLETED and missing is not None:
            recorded = summary.metrics.get(missing)
            status, error = RunStatus.FAILED, f"completed without a finite {missing} (it recorded {recorded!r})"
        attrs |= {"status": status.value, "results": summary.results()} | ({"error": str(error)} if error else {})
        told: list[float] | None = None
        if status == RunStatus.COMPLETED and missing is None:
            state, told = TrialState.COMPLETE, [v for v in values if v is not None]
        else:
            state = TrialState.PRUNED if status == RunStatus.PRUNED else TrialState.FAIL
        if (storage := database_of(self.study)) is not None:
            end_trial(storage, self.study_id, trial.number, state, told, attrs)
        else:  # a journal file: Optuna's own calls, each an appended line
            for key, attr in attrs.items():
                trial.set_user_attr(key, attr)
            self.study.tell(trial, told[0] if told and len(told) == 1 else told, state=state)
        return status


def _expanded(stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Launches as `_compact` stores them, each with its run ids."""
    out: list[dict[str, Any]] = []
    for record in stored:
        launch = {k: v for k, v in record.items() if k != AS_BEFORE}
        launch["run_ids"] = list(out[-1]["run_ids"] if record.get(AS_BEFORE) else record["run_ids"])
        out.append(launch)
    return out


def _compact(launches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`launches` to store, one standing for the same runs as the one before without its ids: the attributes are
    rewritten whole at each launch (1,024 runs' ids grew them 16 KB a relaunch; now ~150 bytes)."""
    stored: list[dict[str, Any]] = []
    for i, launch in enumerate(launches):
        same = i > 0 and launch["run_ids"] == launches[i - 1]["run_ids"]
        rest = {k: v for k, v in launch.items() if k != "run_ids"}
        stored.append(rest | ({AS_BEFORE: True} if same else {"run_ids": launch["run_ids"]}))
    return stored


def _numbers(launches: list[dict[str, Any]]) -> list[int]:
    return [launch[NUMBER] for launch in launches if NUMBER in launch]


def last_number(ledgers: list[Ledger]) -> int:
    """The highest launch number the ledgers hold (0: none numbered)."""
    return max((n for ledger in ledgers for n in _numbers(ledger.launches())), default=0)


def _order(number: int | None, at: Any) -> tuple[int, Any]:
    """Launch order: by number; an old ledger's unnumbered ones first, by time."""
    return (number, 0) if number else (0, at)


def trial_order(trial: FrozenTrial) -> tuple[Any, ...]:
    """A trial's place among its stage's: its launch's number, then its number in its study."""
    return (*_order(trial.user_attrs.get(LAUNCH), trial.datetime_start or datetime.min), trial.number)


def merged_attempts(ledgers: list[Ledger]) -> dict[str, list[FrozenTrial]]:
    """Run id -> its trials in every study of a stage, oldest first (`trial_order`)."""
    out: dict[str, list[list[FrozenTrial]]] = defaultdict(list)
    for ledger in ledgers:
        for run_id, trials in ledger.attempts().items():
            out[run_id].append(trials)
    return {run_id: list(heapq.merge(*studies, key=trial_order)) for run_id, studies in out.items()}


def merged_launches(ledgers: list[Ledger]) -> list[dict[str, Any]]:
    """Every launch of a stage, from all its studies, oldest first: by number."""
    studies = (ledger.launches() for ledger in ledgers)
    return list(heapq.merge(*studies, key=lambda launch: _order(launch.get(NUMBER), launch["at"])))
