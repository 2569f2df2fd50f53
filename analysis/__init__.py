"""Regenerate the CART study's tables, figures and findings from run folders or a results CSV.

Reads what runs wrote (summary.json, metrics.jsonl) or a tidy CSV with pandas, beside the commands in the layers
(pyproject's [tool.importlinter]); it imports no torch.

One package under one name, the one the wheel ships: cart_sweeps.analysis. A checkout's `python -m analysis`
finds this folder under the top-level name `analysis` too; there the name stands for cart_sweeps.analysis and
each of its modules (analysis/alias.py), so no module is ever loaded twice.
"""

if __name__ == "analysis":  # the checkout's top-level name: another name of the one package
    from cart_sweeps.analysis.alias import install

    install()
else:
    from .load import AnalysisError, Study, load_csv, load_runs

    __all__ = ["AnalysisError", "Study", "load_csv", "load_runs"]
