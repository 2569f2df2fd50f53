"""Warm workers (sweep/pools/worker.py): each run a process of its own, forked by its slot's long-lived
worker, computing the numbers of a cold start; a run cancelled, out of time, or orphaned by a killed
worker ends as a cold job's would. Stopping a stage's driver at any moment is in test_stop.py."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from stages import env, leftovers, trials, wait_for, wait_until_gone, with_fault
from test_train import rows

from cart_sweeps.compose import compose_config
from cart_sweeps.data.loader import load_prepared
from cart_sweeps.identity import run_id
from cart_sweeps.record.runfolder import atomic_write
from cart_sweeps.sweep.pool import Task
from cart_sweeps.sweep.pools.local import preloads
from cart_sweeps.sweep.pools.worker import mail

RUN = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_prelude=2", "trainer.threads=1"]
STEPS = ["trainer.steps=20", "trainer.deterministic=true"]


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_one_worker_forks_a_process_per_run_with_the_numbers_of_a_cold_start(tmp_path, data_cache):
    """Two runs through one slot: two processes of one worker; the second, forked from a worker that has
    trained a model before, logs what the same run started alone in a fresh process logs."""
    command = [sys.executable, "-m", "cart_sweeps", "-m", *RUN, "model.n_loops=2,4", *STEPS, "launcher.slots=1"]
    stage = subprocess.run(command, env=env(tmp_path), capture_output=True, text=True, timeout=300)
    assert stage.returncode == 0, stage.stderr[-3000:]
    (mailbox,) = (tmp_path / "1" / ".submitit").glob("worker-*")
    records = [json.loads(mail(mailbox, n, "exit").read_text()) for n in (0, 1)]
    assert [r["code"] for r in records] == [0, 0] and records[0]["pid"] != records[1]["pid"]

    second = next(t for t in trials(tmp_path) if t.params["model.n_loops"] == 2)  # longest first: R=4 ran first
    cold_dir = tmp_path / "cold"  # the run as a cold job ran it: composed and executed in a fresh process
    code = (
        "import json, sys, pathlib; from cart_sweeps.compose import compose_config; from cart_sweeps.run import "
        "execute; execute(compose_config(json.loads(sys.argv[1])), pathlib.Path(sys.argv[2]))"
    )
    cold = [sys.executable, "-c", code, json.dumps(second.user_attrs["overrides"]), str(cold_dir)]
    assert subprocess.run(cold, env=env(tmp_path), capture_output=True, timeout=300).returncode == 0
    warm_dir = Path(second.user_attrs["run_dir"])
    assert rows(warm_dir) == rows(cold_dir)
    warm, cold_summary = (json.loads((d / "summary.json").read_text()) for d in (warm_dir, cold_dir))
    numbers = [k for k in cold_summary if k.startswith(("ppl_", "bpb_", "ce_")) or k in ("rho", "run_id", "step")]
    assert {k: warm[k] for k in numbers} == {k: cold_summary[k] for k in numbers}


START_WORKER = (
    "import sys; from cart_sweeps.sweep.pools.worker import Worker; Worker(sys.argv[1], {}, float(sys.argv[2]))()"
)


class Worker:
    """A worker started by hand (no driver, no controller), its mailbox under `root`."""

    def __init__(self, root: Path, timeout_s: float, fault: str = "") -> None:
        self.mailbox = root / "mailbox"
        self.mailbox.mkdir(parents=True)
        command = [sys.executable, "-c", START_WORKER, str(self.mailbox), str(timeout_s)]
        load_prepared(compose_config(RUN).data)  # the data ready, as a stage's is before its runs start
        self.process = subprocess.Popen(command, env=with_fault(root, fault, root / "mark") if fault else env(root))
        self.n = 0

    def give(self, run_dir: Path, *overrides: str) -> int:
        """Hand over the next run, as the pool does; its number in the mailbox."""
        cfg = compose_config([*RUN, "model.n_loops=2", *overrides])
        task = Task(cfg, str(run_dir), run_id(cfg))
        atomic_write(mail(self.mailbox, self.n, "task"), lambda tmp: tmp.write_bytes(pickle.dumps(task)))
        self.n += 1
        return self.n - 1

    def ended(self, n: int, within: float) -> dict:
        wait_for(mail(self.mailbox, n, "exit").exists, within, f"run {n} to end")
        return json.loads(mail(self.mailbox, n, "exit").read_text())


def status(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["status"]


def started(run_dir: Path) -> bool:
    return (run_dir / "summary.json").exists() and status(run_dir) == "running"


@pytest.mark.slow
def test_a_run_cancelled_out_of_time_or_orphaned_stops_as_on_ctrl_c_and_the_worker_goes_on(tmp_path, data_cache):
    worker = Worker(tmp_path, timeout_s=8)
    long = ["trainer.steps=100000", "trainer.log_every=1", "trainer.compile=false"]  # in training at 8 s

    timed_out = worker.give(tmp_path / "slow", *long)  # out of time: SIGINT, the run says interrupted
    record = worker.ended(timed_out, 60)
    assert record == {"pid": record["pid"], "code": -2, "timed_out": True, "orphaned": False}
    assert status(tmp_path / "slow") == "interrupted"

    cancelled = worker.give(tmp_path / "pruned", *long)  # the same worker takes the next run
    wait_for(lambda: started(tmp_path / "pruned"), 60, "the second run to start")
    mail(worker.mailbox, cancelled, "cancel").touch()
    assert worker.ended(cancelled, 10)["code"] == -2 and status(tmp_path / "pruned") == "interrupted"

    orphaned = worker.give(tmp_path / "orphan", *long)
    wait_for(lambda: started(tmp_path / "orphan"), 60, "the third run to start")
    assert len(leftovers(tmp_path)) == 2  # the worker and its run
    worker.process.kill()  # kill -9: the run notices its worker is gone
    wait_until_gone(tmp_path, 10)
    assert status(tmp_path / "orphan") == "interrupted" and not mail(worker.mailbox, orphaned, "exit").exists()


@pytest.mark.slow
def test_a_ctrl_c_python_swallows_still_stops_the_run_at_its_next_step(tmp_path, data_cache):
    """A SIGINT whose KeyboardInterrupt is raised inside a weakref callback is printed and dropped by Python
    (as it was inside torch.compile: the run trained on until the worker's SIGKILL); the run stops as on
    Ctrl-C at its next step (cart_sweeps.interrupt)."""
    worker = Worker(tmp_path, timeout_s=300, fault="step:lost-sigint:3")
    ended = worker.ended(worker.give(tmp_path / "run", "trainer.steps=20", "trainer.log_every=1"), 120)
    assert ended["code"] == -2 and not ended["timed_out"]
    assert status(tmp_path / "run") == "interrupted"
    assert [row["step"] for row in rows(tmp_path / "run") if row["kind"] == "train"] == [1, 2, 3]
    assert "Exception ignored" in (tmp_path / "run" / "run.log").read_text()  # the fault did lose the SIGINT
    worker.process.kill()


def test_a_worker_hashes_the_data_once_and_its_runs_inherit_the_hashes(tmp_path, data_cache):
    """The worker checks a run's data before forking it (pools/worker._check_data), so a forked run finds the
    sha256 of each bin and of each local input its recipe hash covers already computed: once per worker, not
    once per run (seconds a run at the paper's data; four hashes of the embedded corpus' 4.6 MB a run here)."""
    import multiprocessing

    from cart_sweeps.data.errors import DataError
    from cart_sweeps.data.hashes import _sha256
    from cart_sweeps.data.loader import load_prepared
    from cart_sweeps.data.recipe import as_config, local_files, recipe_dir, recipe_hash
    from cart_sweeps.sweep.pools.worker import _check_data

    cfg = compose_config(["scale=tiny", "trainer.steps=1"])
    load_prepared(cfg.data)  # prepared (if it was not), as a stage's data is before it runs
    _sha256.cache_clear()
    _check_data(Task(cfg, str(tmp_path / "run"), run_id(cfg)))
    inputs = [f for spec in [*cfg.data.sources, *cfg.data.validation] for f in local_files(spec)]
    assert inputs and _sha256.cache_info().currsize == len(inputs) + 1 + len(cfg.data.validation)  # and the bins

    def run() -> None:  # what a forked run does first: load its data, checking its recipe and every bin
        before = _sha256.cache_info()
        load_prepared(cfg.data)
        after = _sha256.cache_info()
        sys.exit(0 if after.misses == before.misses and after.hits > before.hits else 1)

    child = multiprocessing.get_context("fork").Process(target=run)
    child.start()
    child.join()
    assert child.exitcode == 0

    # a recipe whose folder is damaged (its manifest overwritten): left to the run to report, the worker goes on
    damaged = compose_config(["scale=tiny", f"data.cache_dir={tmp_path / 'cache'}"])
    folder = recipe_dir(as_config(damaged.data), recipe_hash(as_config(damaged.data)))
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("not json")
    _check_data(Task(damaged, str(tmp_path / "run2"), run_id(damaged)))
    with pytest.raises(DataError):
        load_prepared(damaged.data)  # what the run then says, in one line


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_worker_preloads_what_its_stages_runs_import():
    """torch._dynamo (imported by torch.optim's first step) for training stages only: an evaluation, run in a
    fresh process, never imports it, so an evaluate stage's workers skip it; lm-eval where harness.tasks."""
    assert preloads(compose_config(["stage=1", "scale=tiny"])) == ("torch._dynamo",)
    assert preloads(compose_config(["stage=benchmarks", "scale=tiny"])) == ("cart_sweeps.harness.bench",)
    assert preloads(compose_config(["stage=variable_r", "scale=tiny", "harness.tasks=[]"])) == ()
    code = (
        "import sys, torch; from cart_sweeps.compose import compose_config; from cart_sweeps.model import build_model\n"
        "from cart_sweeps.train.setup import build_optimizer\n"
        "cfg = compose_config(['scale=tiny']); model = build_model(cfg.model)\n"
        "with torch.no_grad(): model(torch.zeros(1, 8, dtype=torch.long))\n"
        "evaluated = 'torch._dynamo' in sys.modules\n"
        "optimizer = build_optimizer(model, cfg.trainer, torch.device('cpu'))\n"
        "model(torch.zeros(1, 8, dtype=torch.long)).float().mean().backward(); optimizer.step()\n"
        "print(evaluated, 'torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "True"], done.stderr[-2000:]


def test_a_forked_runs_collector_walks_only_what_the_run_makes():
    """A worker freezes what it preloaded (torch, the project) out of the collector: a forked run's full
    collections walk the objects the run itself makes, not the worker's (each run's first one spent 0.25-0.33 s
    walking them, and copied the pages it touched)."""
    code = (
        "import gc, os; from cart_sweeps.sweep.pools.worker import _preload\n"
        "_preload(())\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print(len(gc.get_objects()), gc.get_freeze_count(), flush=True); os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    walked, frozen = map(int, done.stdout.split())
    assert frozen > 100_000 and walked < frozen / 20, done.stderr[-2000:]
