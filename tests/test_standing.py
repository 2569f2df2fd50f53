"""Where a run stands is one rule (stagerecord/standing.py): the run set the analysis and `plan` table by says what
the driver acts on, in the two cases where they used to disagree. Real SQLite ledgers, no training."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from cart_sweeps.record.summary import RunSummary
from cart_sweeps.stagerecord.ledger import Ledger
from cart_sweeps.stagerecord.results import standing
from cart_sweeps.stagerecord.runset import stage_runs
from cart_sweeps.stagerecord.standing import Standing
from cart_sweeps.status import RunStatus
from cart_sweeps.sweep.expand import Run

RUN_ID, LABEL = "0123456789ab", "d32-P2-R2-s42"


def one_run_ledger(root: Path) -> tuple[Ledger, Any]:
    """A stage `s` whose one launch stands for one run, with a trial started for it (its folder never made)."""
    ledger = Ledger.open(root / "s", "s", "sqlite")
    ledger.record_launch([RUN_ID], ["stage=s"])
    attrs = {"run_id": RUN_ID, "label": LABEL, "run_dir": str(root / "s" / f"{LABEL}-{RUN_ID[:8]}")}
    trial = ledger.start({"seed": 42}, {"seed": IntDistribution(0, 1000)}, attrs | {"config_id": "c", "overrides": []})
    return ledger, trial


def driver_says(ledger: Ledger) -> Standing:
    """The driver's standing of the run, from the ledger's trials and its folder (gone: no result held)."""
    return standing(cast(Run, None), ledger.attempts()[RUN_ID], held=None)  # `run` is not read by the rule


def test_a_pruned_run_whose_folder_is_gone_is_lost_for_both(tmp_path: Path) -> None:
    """The run set listed it as pruned, left out; the driver calls it lost and trains it again. Both: lost."""
    ledger, trial = one_run_ledger(tmp_path)
    ledger.finish(trial, RunSummary(status=RunStatus.PRUNED, run_id=RUN_ID, label=LABEL), "ppl_austen")
    assert driver_says(ledger) == Standing.LOST
    runs = stage_runs(tmp_path, "s")
    assert runs.missing == [LABEL] and not runs.left_out and not runs.used and not runs.pending


def test_an_unknown_status_is_failed_for_both(tmp_path: Path, capsys) -> None:
    """A status this version does not know (a ledger edited by hand): the driver retries the run as failed; the
    run set listed the unknown word as the run's status. Both: failed, to retry."""
    ledger, trial = one_run_ledger(tmp_path)
    trial.set_user_attr("status", "preempted")
    ledger.study.tell(trial, state=TrialState.FAIL)
    assert driver_says(ledger) == Standing.RETRY
    (pending,) = stage_runs(tmp_path, "s").pending
    assert pending.status == RunStatus.FAILED
    assert "'preempted' is not one this version knows" in capsys.readouterr().err
