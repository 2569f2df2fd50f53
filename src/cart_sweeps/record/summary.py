"""A run's summary, typed: one record for the trainer, the ledger, the driver and the analysis; on disk the flat
JSON object summary.json always was (metrics such as `ppl_austen` at the top level)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from cart_sweeps.metric import is_metric, metric
from cart_sweeps.status import RunStatus


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
    first_step_at: float | None = None  # Unix time this process began its first training step (launch overhead)
    details: dict[str, Any] = field(default_factory=dict)

    # The fields the ledger keeps with the metrics (the run folder keeps the rest).
    RESULT_FIELDS = ("rho", "step", "params_stored", "params_effective", "tokens_per_s", "wall_time_s")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        """From summary.json's object (or a job's result); a status it does not know reads as failed."""
        summary = cls()
        summary.update(data)
        return summary

    def update(self, values: dict[str, Any]) -> None:
        """Take a flat mapping's values: its fields, its metrics, and the rest into `details`."""
        for key, value in values.items():
            if key == "status":
                self.status = RunStatus.read(value, RunStatus.FAILED)[0]
            elif is_metric(key):
                self.metrics[key] = value
            elif key in _FIELDS:
                setattr(self, key, value)
            else:
                self.details[key] = value

    def to_dict(self) -> dict[str, Any]:
        """The flat object summary.json holds (None fields left out, as the trainer always wrote it)."""
        out: dict[str, Any] = {**self.details, "status": self.status}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("status", "metrics", "details") and value is not None:
                out[f.name] = value
        return {**out, **self.metrics}

    def config(self) -> dict[str, Any]:
        """The recorded config, flat: `model.*`, `trainer.*`, `data` and `seed`."""
        flat = {f"{group}.{k}": v for group in ("model", "trainer") for k, v in (self.details.get(group) or {}).items()}
        return flat | {"data": self.details.get("data"), "seed": self.details.get("seed")}

    @property
    def is_result(self) -> bool:
        return self.status.is_result

    def value(self, name: str) -> float | None:
        """The metric `name` (or a run-wide figure) when the run measured it: a finite number in its kind's range."""
        value = self.metrics.get(name, getattr(self, name) if name in self.RESULT_FIELDS else None)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        known = metric(name)
        return float(value) if known is None or known.valid(value) else None

    def results(self) -> dict[str, Any]:
        """The final numbers that belong in the ledger."""
        kept = {k: getattr(self, k) for k in self.RESULT_FIELDS if getattr(self, k) is not None}
        return {**self.metrics, **kept}


_FIELDS = {f.name for f in fields(RunSummary)} - {"status", "metrics", "details"}
