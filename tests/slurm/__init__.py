"""A real single-node SLURM cluster for tests: cluster.sh starts it, fixtures.py finds it."""
