"""Hydra plugins of cart_sweeps: `-m` runs a stage through our Optuna sweeper and submitit launcher."""
