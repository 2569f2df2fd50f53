"""Regenerate the CART study's tables, figures and findings from run folders or a results CSV.

Reads what runs wrote (summary.json, metrics.jsonl) or a tidy CSV with pandas, choosing runs by the run set
cart_sweeps defines (cart_sweeps.sweep.runset); imports no torch.
"""

from .load import AnalysisError, Study, load_csv, load_runs

__all__ = ["AnalysisError", "Study", "load_csv", "load_runs"]
