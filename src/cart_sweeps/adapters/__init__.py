"""The one door to third-party internals: every private API of Hydra, OmegaConf, Optuna and submitit the project
still needs is called from a module here, one small function each, its docstring naming the private API, why no
public one serves and the releases checked. tests/test_adapters.py fails by name when an upgrade breaks one;
tests/pins/check.sh runs it on the lowest and highest releases pyproject.toml allows. No other module imports a
private name of these packages.
"""
