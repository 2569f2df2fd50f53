"""The engine: a stage expanded into its runs (expand), the driver that runs them against its ledger (driver),
the pools they run on (pool, pools/), live progress (progress) and cost estimates for `plan` (cost)."""
