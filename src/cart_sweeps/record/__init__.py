"""A run's record in its folder (config.yaml, metrics.jsonl, summary.json, checkpoints/): its format, written
by the run and read by the stages and the analysis, so it sits below both."""
