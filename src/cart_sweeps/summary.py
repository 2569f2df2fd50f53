"""A run's summary, typed: one record for the trainer, the ledger, the driver, the progress line and the analysis.

On disk it stays the flat JSON object summary.json always was (metrics such as `ppl_austen` at the top
level), so every existing run folder reads back unchanged. Torch-free, like everything the driver and
the analysis import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from cart_sweeps.status import RunStatus

# What each evaluation measures on each validation set, stored as `<kind>_<set>` (ppl_austen, ...).
METRIC_KINDS = ("ppl", "bpb", "ce")


def metric_names(val_sets: list[str]) -> list[str]:
    """Every metric a run on validation sets `val_sets` reports (what sweep.metric may name)."""
    return [f"{kind}_{name}" for kind in METRIC_KINDS for name in val_sets]


def is_metric(key: str) -> bool:
    return key.split("_", 1)[0] in METRIC_KINDS and "_" in key


@dataclass
class RunSummary:
    """How a run stands; `metrics` are its last evaluation's, `details` everything else summary.json holds
    (identity fields, the model and trainer config, the environment)."""

    status: RunStatus = RunStatus.FAILED
    run_id: str | None = None
    label: str | None = None
    step: int | None = None
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rho: float | None = None
    params_stored: int | None = None
    params_effective: int | None = None
    tokens_per_s: float | None = None
    wall_time_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    # The fields the ledger keeps with the metrics (the run folder keeps the rest).
    RESULT_FIELDS = ("rho", "step", "params_stored", "params_effective", "tokens_per_s", "wall_time_s")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        """From summary.json's object (or a job's result): unknown keys land in `details`."""
        named = {f.name for f in fields(cls)} - {"metrics", "details", "status"}
        status = data.get("status", RunStatus.FAILED)
        return cls(
            status=RunStatus(status) if status in RunStatus._value2member_map_ else RunStatus.FAILED,
            metrics={k: v for k, v in data.items() if is_metric(k)},
            details={k: v for k, v in data.items() if k not in named and k != "status" and not is_metric(k)},
            **{k: data[k] for k in named if k in data},
        )

    def to_dict(self) -> dict[str, Any]:
        """The flat object summary.json holds (None fields left out, as the trainer always wrote it)."""
        out: dict[str, Any] = {**self.details, "status": self.status}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("status", "metrics", "details") and value is not None:
                out[f.name] = value
        return {**out, **self.metrics}

    def value(self, metric: str) -> float | None:
        """The sweep metric, when the run measured a finite one."""
        value = self.metrics.get(metric)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

    def results(self) -> dict[str, Any]:
        """The final numbers that belong in the ledger."""
        kept = {k: getattr(self, k) for k in self.RESULT_FIELDS if getattr(self, k) is not None}
        return {**self.metrics, **kept}
