"""The study's benchmark call: lm-eval on a trained run at one R, its JSON into a run folder, its numbers
flattened into summary keys (`bench_<task>_<metric>`) that the ledger and the analysis read like any metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lm_eval import simple_evaluate
from lm_eval.loggers import EvaluationTracker
from lm_eval.tasks import TaskManager

from cart_sweeps.harness import TASKS_DIR
from cart_sweeps.harness.model import CartLM
from cart_sweeps.metric import BENCH

RESULTS_DIR = "lm_eval"  # in the evaluating run's folder: lm-eval's own results_<time>.json


def summary_metrics(results: dict[str, Any]) -> dict[str, float]:
    """lm-eval's per-task numbers as flat summary keys (`acc,none` of hellaswag -> bench_hellaswag_acc; another
    filter than `none` as a suffix); standard errors stay in the JSON."""
    out = {}
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")
            if not filt or metric.endswith("_stderr") or not isinstance(value, int | float):
                continue
            out[f"{BENCH}_{task}_{metric}" + ("" if filt == "none" else f"_{filt}")] = float(value)
    return out


def task_manager(tasks: list[str]) -> TaskManager:
    """Our shipped tasks, plus lm-eval's own only when a task needs them (indexing them takes a minute)."""
    ours = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    if all(task in ours.all_tasks for task in tasks):
        return ours
    return TaskManager(include_path=str(TASKS_DIR))


def run_benchmarks(
    source: Path,
    n_loops: int | None,
    tasks: list[str],
    out_dir: Path,
    num_fewshot: int | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    step: int | None = None,
) -> dict[str, float]:
    """`source`'s checkpoint at `step` (None: its newest) at R = `n_loops` on `tasks`, into `out_dir`/lm_eval."""
    lm = CartLM(run_dir=str(source), n_loops=n_loops, batch_size=batch_size, step=step)
    tracker = EvaluationTracker(output_path=str(out_dir / RESULTS_DIR / "results.json"))  # results_<time>.json
    results = simple_evaluate(
        model=lm,
        tasks=list(tasks),
        num_fewshot=num_fewshot,
        limit=limit,
        task_manager=task_manager(tasks),
        evaluation_tracker=tracker,
        # 0: no standard errors. lm-eval bootstraps perplexity's in a multiprocessing.Pool whose exit SIGTERMs its
        # forked workers, and a submitit job's workers inherit its SIGTERM bypass: the run would hang there.
        bootstrap_iters=0,
    )
    tracker.save_results_aggregated(results=results, samples=None)
    return summary_metrics(results)
