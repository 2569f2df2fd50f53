"""Every trial of a study, read with SQL rather than Optuna's ORM: `get_trials()` builds 174,000 objects for
10,240 runs (~10 s); the same six queries through SQLAlchemy Core on Optuna's tables (via adapters.optuna) take
1.4 s (`python -m cart_sweeps.bench_scale --ledger-trials 10240`; tests/test_ledger.py checks them equal)."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Collection
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import select

from cart_sweeps.adapters.optuna import database_of, optuna_tables


@functools.cache
def _distribution(text: str) -> BaseDistribution:
    """A parsed distribution, once per distinct JSON (a stage's trials share a handful)."""
    return json_to_distribution(text)


def all_trials(study: optuna.Study, states: Collection[TrialState] | None = None) -> list[FrozenTrial]:
    """`study.get_trials(deepcopy=False, states=states)`, in trial order; the trials are not to be modified."""
    storage = database_of(study)
    if storage is None:
        return study.get_trials(deepcopy=False, states=states)
    trials = optuna_tables.TrialModel.__table__
    mine = trials.c.study_id == storage.get_study_id_from_name(study.study_name)
    if states is not None:
        mine &= trials.c.state.in_(list(states))
    ids = select(trials.c.trial_id).where(mine).scalar_subquery()

    def rows(model: Any, *columns: str) -> list[Any]:
        """(trial_id, *columns) of the study's trials in `model`'s table, in the order rows were written."""
        table = model.__table__
        key = next(iter(table.primary_key.columns))
        query = select(table.c.trial_id, *(table.c[c] for c in columns)).where(table.c.trial_id.in_(ids))
        return list(conn.execute(query.order_by(key)).all())

    with storage.engine.connect() as conn:
        head = ("trial_id", "number", "state", "datetime_start", "datetime_complete")
        heads = conn.execute(select(*(trials.c[c] for c in head)).where(mine).order_by(trials.c.trial_id)).all()
        params = rows(optuna_tables.TrialParamModel, "param_name", "param_value", "distribution_json")
        values = rows(optuna_tables.TrialValueModel, "objective", "value", "value_type")
        steps = rows(optuna_tables.TrialIntermediateValueModel, "step", "intermediate_value", "intermediate_value_type")
        user = rows(optuna_tables.TrialUserAttributeModel, "key", "value_json")
        system = rows(optuna_tables.TrialSystemAttributeModel, "key", "value_json")

    def per_trial() -> defaultdict[int, dict[Any, Any]]:
        return defaultdict(dict)

    params_of, distributions_of, values_of, steps_of = per_trial(), per_trial(), per_trial(), per_trial()
    for trial_id, name, value, text in params:
        distribution = _distribution(text)
        params_of[trial_id][name] = distribution.to_external_repr(value)
        distributions_of[trial_id][name] = distribution
    for trial_id, objective, value, kind in values:
        values_of[trial_id][objective] = optuna_tables.TrialValueModel.stored_repr_to_value(value, kind)
    for trial_id, step, value, kind in steps:
        steps_of[trial_id][step] = optuna_tables.TrialIntermediateValueModel.stored_repr_to_intermediate_value(
            value, kind
        )
    user_of, system_of = per_trial(), per_trial()
    for attrs_of, rows_read in ((user_of, user), (system_of, system)):
        for trial_id, key, text in rows_read:
            attrs_of[trial_id][key] = json.loads(text)

    def frozen(trial_id: int, number: int, state: TrialState, start: Any, complete: Any) -> FrozenTrial:
        objectives = values_of.get(trial_id)
        return FrozenTrial(
            number=number,
            state=state,
            value=None,
            values=[objectives[k] for k in sorted(objectives)] if objectives else None,
            datetime_start=start,
            datetime_complete=complete,
            params=params_of.get(trial_id, {}),
            distributions=distributions_of.get(trial_id, {}),
            user_attrs=user_of.get(trial_id, {}),
            system_attrs=system_of.get(trial_id, {}),
            intermediate_values=steps_of.get(trial_id, {}),
            trial_id=trial_id,
        )

    return [frozen(*head) for head in heads]
