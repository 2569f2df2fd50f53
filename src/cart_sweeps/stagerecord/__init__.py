"""What a stage leaves for its readers: its ledger (the Optuna studies, read with SQL), the run set its conclusions
use, where each run stands, and the candidates a later stage takes from it (zoom, best).

The engine (`cart_sweeps.sweep`: expansion, driver, pools) writes this record; `plan`, the analysis and the
dashboard read it, and import nothing of the engine to do so.
"""
