"""Regenerate the CART study's tables, figures and findings from run folders or a results CSV.

Reads what runs wrote (summary.json, metrics.jsonl) or a tidy CSV with pandas. Beside the commands in the
layers (pyproject's [tool.importlinter]): it reads runs through cart_sweeps's run record (cart_sweeps.record),
run set and ledger (cart_sweeps.sweep.runset, .ledger: optuna), and types through its schema and stage roles;
it imports no torch.
"""

from .load import AnalysisError, Study, load_csv, load_runs

__all__ = ["AnalysisError", "Study", "load_csv", "load_runs"]
