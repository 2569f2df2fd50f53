"""Optuna's database tables and transactions: what a ledger writes in one transaction and reads with SQL."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, cast

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._rdb import models as optuna_tables
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import TrialState

__all__ = ["database_of", "end_trial", "optuna_tables", "study_storage", "transaction"]
# `optuna_tables` (optuna.storages._rdb.models, private): the SQLAlchemy models of Optuna's schema, which the ledger
# reads with SQL (stagerecord/trials.py: 10 s -> 1.4 s for 10,240 trials) and writes in one transaction. Optuna
# offers no public schema. Checked on optuna 5.0.0 and 5.1.0.


def study_storage(study: optuna.Study) -> BaseStorage:
    """The storage a study writes through (`Study._storage`, private; Optuna keeps no public handle on it): a new
    trial must go through it, its trial cache included. Checked on optuna 5.0.0 and 5.1.0."""
    return cast(BaseStorage, study._storage)


def database_of(study: optuna.Study) -> RDBStorage | None:
    """The study's database; None for another storage (a journal file). Optuna wraps a database in a trial cache
    whose `_backend` (private) is the database. Checked on optuna 5.0.0 and 5.1.0."""
    storage = getattr(study_storage(study), "_backend", study_storage(study))
    return storage if isinstance(storage, RDBStorage) else None


def transaction(storage: RDBStorage) -> AbstractContextManager[Any]:
    """A session of `storage` committed on leaving, rolled back and closed on any error
    (`optuna.storages._rdb.storage._create_scoped_session`, private: the public calls each commit on their own).
    Checked on optuna 5.0.0 and 5.1.0."""
    return _create_scoped_session(storage.scoped_session)


def end_trial(
    storage: RDBStorage,
    study_id: int,
    number: int,
    state: TrialState,
    values: list[float] | None,
    attrs: dict[str, Any],
) -> None:
    """What `set_user_attr` for each attr, then `Study.tell`, write, in one transaction: a run's ending is in the
    ledger whole or not at all. A pruned trial takes its last intermediate value (unless NaN), as tell does; tell's
    `sampler.after_trial` is left out (the ledger's samplers do nothing there). Uses the storage's private
    `_set_trial_attr_without_commit` and `_set_trial_value_without_commit` (the public setters commit each).
    Checked on optuna 5.0.0 and 5.1.0."""
    trials = optuna_tables.TrialModel
    with transaction(storage) as session:
        row = session.query(trials).filter(trials.study_id == study_id, trials.number == number).with_for_update()
        row = row.one()
        storage.check_trial_is_updatable(row.trial_id, cast(TrialState, row.state))
        for key, attr in attrs.items():
            storage._set_trial_attr_without_commit(
                session, optuna_tables.TrialUserAttributeModel, row.trial_id, key, attr
            )
        if state == TrialState.PRUNED and (last := _last_intermediate(session, row.trial_id)) is not None:
            values = [last]
        for objective, value in enumerate(values or []):
            storage._set_trial_value_without_commit(session, row, objective, value)
        row.state = state
        row.datetime_complete = datetime.now()


def _last_intermediate(session: Any, trial_id: int) -> float | None:
    """The trial's intermediate value at its highest step unless NaN (Optuna's value of a pruned trial)."""
    table = optuna_tables.TrialIntermediateValueModel
    last = session.query(table).filter(table.trial_id == trial_id).order_by(table.step.desc()).first()
    if last is None:
        return None
    reported = table.stored_repr_to_intermediate_value(last.intermediate_value, last.intermediate_value_type)
    return None if math.isnan(reported) else reported
