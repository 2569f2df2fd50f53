"""Stages of the study: expansion into runs (expand), the Optuna ledger (ledger), submitit pools (launcher),
the driver between them (driver), live progress (progress) and cost estimates for `plan` (cost)."""
