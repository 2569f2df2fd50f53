"""The one door to third-party internals: every private API of Hydra, OmegaConf, Optuna and submitit the project
needs is called from here, its docstring naming it, why no public one serves and the releases checked
(tests/test_adapters.py fails by name when an upgrade breaks one).
"""
