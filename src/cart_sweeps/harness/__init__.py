"""Downstream benchmarks through the LM Evaluation Harness (lm-eval 0.4): any run folder at any loop count;
`tasks/` holds the offline tasks built from the embedded corpus's validation text."""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
SHIPPED_TASKS = frozenset({p.stem for p in TASKS_DIR.glob("*.yaml")} | {"cart_tiny"})  # offline: no hub needed
