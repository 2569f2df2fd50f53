"""Regenerate the CART study's tables, figures and findings from run folders or a results CSV.

Reads what runs wrote (summary.json, metrics.jsonl) or a tidy CSV with pandas; imports no torch and
nothing from cart_sweeps, so it runs anywhere the results are.
"""

from analysis.load import AnalysisError, Study, load_csv, load_runs

__all__ = ["AnalysisError", "Study", "load_csv", "load_runs"]
