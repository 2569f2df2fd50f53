"""How a run stands: one vocabulary for the trainer, the ledger, the driver and the analysis (plain strings on disk)."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    RUNNING = "running"  # a process trains it now, or was cut off (kill -9, node loss): resumes when relaunched
    COMPLETED = "completed"  # reached its last step; its summary carries the final metrics
    DIVERGED = "diverged"  # the loss stopped being finite: a result, never retried
    FAILED = "failed"  # an error in the run; retried up to sweep.max_retries
    INTERRUPTED = "interrupted"  # stopped by its driver or user (Ctrl-C, SIGTERM); resumes when relaunched
    CANCELLED = "cancelled"  # ended from outside (scancel, an OOM kill, preemption without requeue): not retried now
    REJECTED = "rejected"  # cannot succeed as given (a setting this machine cannot run, a busy folder): not retried
    PRUNED = "pruned"  # stopped early by a search's pruner (sweep.pruner): its learning curve is its result

    @classmethod
    def read(cls, value: object, fallback: RunStatus) -> tuple[RunStatus, str | None]:
        """A status as another writer left it: a known one, or `fallback` and one line saying what was not known."""
        if isinstance(value, str) and value in cls._value2member_map_:
            return cls(value), None
        return fallback, f"status {value!r} is not one this version knows; read as {fallback.value}"

    @property
    def is_result(self) -> bool:
        """A relaunch keeps it: the run is done, one way or the other (a pruned run on purpose)."""
        return self in (RunStatus.COMPLETED, RunStatus.DIVERGED, RunStatus.PRUNED)

    @property
    def retry_now(self) -> bool:
        """The driver tries it again within the same launch (a relaunch tries every non-result again)."""
        return self is RunStatus.FAILED
