"""Where a run stands, from its newest trial and what its folder holds: the one rule the driver acts on, `plan`
shows and the run set tables by; below both, so neither imports the other."""

from __future__ import annotations

from enum import StrEnum

from optuna.trial import FrozenTrial, TrialState

from cart_sweeps.record.summary import RunSummary
from cart_sweeps.stagerecord.ledger import status_of
from cart_sweeps.status import RunStatus


class Standing(StrEnum):
    """Where a run stands before a launch."""

    NEW = "new"  # no trial and no result
    RECOVERED = "recovered"  # no trial, but its folder holds a result: the ledger lacks it
    REFERENCED = "referenced"  # no result of its own, but another stage's folder holds it: recorded, not trained
    CUT_OFF = "cut off"  # its newest trial is running: its driver died (or runs now)
    DONE = "done"  # its newest trial is a result, and its folder still holds it
    LOST = "lost"  # the ledger says done, but the run folder that held the result is gone
    RETRY = "retry"  # failed, interrupted, cancelled, rejected before (or a status this version does not know)
    MOVED = "moved"  # its result is in a folder of another name: trained again only once that folder is gone
    OCCUPIED = "occupied"  # to train, but its folder holds another run: trained once that is moved aside


def stand(
    last: FrozenTrial | None,
    result: bool,
    scanned: bool = False,
    moved: bool = False,
    occupied: bool = False,
) -> Standing:
    """Where a run stands from its newest trial (or None) and whether a folder holds its result (`scanned`:
    another stage's; `moved`: of another name); `occupied`: its own folder holds another run."""
    if result and scanned:
        return Standing.REFERENCED
    if result and moved:
        return Standing.MOVED
    if last is not None and last.state == TrialState.RUNNING:
        return Standing.CUT_OFF
    if not result and occupied:
        return Standing.OCCUPIED
    if last is None:
        return Standing.RECOVERED if result else Standing.NEW
    if status_of(last).is_result:
        return Standing.DONE if result else Standing.LOST
    return Standing.RETRY


def status_at(where: Standing, last: FrozenTrial | None, result: RunSummary | None) -> str:
    """The status a reader tables: its result's (a cut-off run may have one), `lost`, `new`, or its attempt's."""
    if result is not None and result.is_result:
        return str(result.status)
    if where == Standing.LOST:
        return "lost"
    if last is None:
        return "new"
    return str(RunStatus.RUNNING if where == Standing.CUT_OFF else status_of(last))
