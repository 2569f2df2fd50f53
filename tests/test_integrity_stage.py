"""A stage's ledger and run folders survive ordinary accidents: each test causes one, with real processes,
real files and the real ledger, then relaunches and checks that the ledger, the run folders and `plan` agree.

The run-folder faults (a half-final summary, a damaged checkpoint or metrics file, two processes in one
folder) are in test_integrity_run.py; stopping a driver at any moment is in test_stop.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState
from stages import env, read_only, small_disk, sweep, sweep_cmd, trials, wait_for, wait_until_gone, with_fault
from test_identity import completed_source

from cart_sweeps.stagerecord.ledger import Ledger
from cart_sweeps.stagerecord.runset import stage_runs
from cart_sweeps.sweep.expand import Stage

pytestmark = pytest.mark.slow  # faults caused in real stages: the full tier (make test-full)

GRID = ["stage=1", "scale=tiny", "model.d_model=256", "model.n_loops=2,4", "model.n_prelude=2", "trainer.steps=20"]


def plan(runs: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "cart_sweeps.plan", *GRID, "plan.format=csv"]
    return subprocess.run(command, env=env(runs), capture_output=True, text=True, timeout=120)


def plan_status(out: str) -> dict[str, str]:
    """label -> status column of `plan`'s CSV."""
    lines = out.splitlines()
    header = lines[0].split(",")
    rows = (dict(zip(header, line.split(","), strict=True)) for line in lines[1:])
    return {row["label"]: row["status"] for row in rows}


def summaries(runs: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (runs / "1").glob("*/summary.json")}


def modified(runs: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (runs / "1").glob("*/summary.json")}


@pytest.fixture
def finished(tmp_path, data_cache) -> Path:
    done = sweep(tmp_path, *GRID)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path


def test_a_deleted_run_folder_is_noticed_and_run_again(finished):
    """Item 4: the ledger said completed, the relaunch skipped it, plan said completed."""
    runs = finished
    gone = next(p for p in (runs / "1").iterdir() if p.name.startswith("d32-P2-R4"))
    kept = {k: v for k, v in modified(runs).items() if k != gone.name}
    shutil.rmtree(gone)
    listed = plan(runs)
    assert listed.returncode == 0, listed.stderr
    assert plan_status(listed.stdout) == {"d32-P2-R2-s42": "completed", "d32-P2-R4-s42": "lost"}
    proc = sweep(runs, *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 done, skipped" in proc.stdout
    assert "1 run the ledger holds as done lost their run folder" in proc.stdout
    assert summaries(runs)[gone.name]["status"] == "completed"
    assert {k: v for k, v in modified(runs).items() if k != gone.name} == kept  # the other run was not touched
    assert plan_status(plan(runs).stdout) == {"d32-P2-R2-s42": "completed", "d32-P2-R4-s42": "completed"}


def test_a_damaged_ledger_is_set_aside_and_rebuilt_from_the_run_folders(finished):
    """Item 8: `truncate -s 0 runs/1/ledger.db` made plan and a relaunch a 90-line traceback."""
    runs = finished
    before = modified(runs)
    (runs / "1" / "ledger.db").write_bytes(b"")
    listed = plan(runs)
    assert listed.returncode == 0, listed.stderr
    warning = [line for line in listed.stderr.splitlines() if "does not open" in line]  # beside plan's makespan line
    assert len(warning) == 1 and "Traceback" not in listed.stderr, listed.stderr
    assert set(plan_status(listed.stdout).values()) == {"completed"}  # read from the run folders
    proc = sweep(runs, *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 done, skipped" in proc.stdout and "2 results recorded in the ledger from their run folders" in proc.stdout
    assert len(list((runs / "1").glob("ledger.db.damaged-*"))) == 1  # set aside, not deleted
    rebuilt = trials(runs)
    assert len(rebuilt) == 2 and {t.state for t in rebuilt} == {TrialState.COMPLETE}
    values = {Path(t.user_attrs["run_dir"]).name: t.value for t in rebuilt}
    assert values == {name: s["ppl_austen"] for name, s in summaries(runs).items()}
    assert modified(runs) == before  # nothing trained again


def test_a_driver_killed_between_starting_a_trial_and_submitting_its_run_leaves_one_attempt(tmp_path, data_cache):
    """A trial started by a driver killed before it submitted the run is resumed, not left beside a new one."""
    mark = tmp_path / "mark"
    driver = subprocess.Popen(sweep_cmd(*GRID), env=with_fault(tmp_path, "queue:pause", mark))
    wait_for(mark.exists, 120, "the driver to start its first run's trial")
    driver.kill()
    driver.wait(30)
    proc = sweep(tmp_path, *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 cut off, resumed" in proc.stdout
    found = trials(tmp_path)
    assert len(found) == 2 and {t.state for t in found} == {TrialState.COMPLETE}  # one attempt per run


@pytest.mark.parametrize(
    ("bad", "extra_env", "says"),
    [
        (["launcher.slots=0"], {}, "launcher.slots=0 must be >= 1"),
        (["launcher.poll_s=-1"], {}, "launcher.poll_s=-1.0 must be >= 0.001"),
        (["trainer.steps=-5,3000"], {}, "trainer.steps=-5 must be >= 1"),
        (["sweep.metric=ppl_wiki"], {}, "sweep.metric=ppl_wiki is not measured with data=embedded"),
        (["trainer.device=cuda"], {"CUDA_VISIBLE_DEVICES": ""}, "trainer.device=cuda needs a CUDA GPU"),
        (["data.cache_dir={tmp}/a-file/cache"], {}, "is not writable"),
        (["logger=wandb", "logger.mode=online"], {"WANDB_API_KEY": "", "HOME": "{tmp}"}, "needs a W&B login"),
        (["trainer.eval_windows=0"], {}, "trainer.eval_windows=0 must be >= 1"),
        (["trainer.eval_batch_size=0"], {}, "trainer.eval_batch_size=0 must be >= 1"),
        (["trainer.lr=-1"], {}, "trainer.lr=-1.0 must be > 0"),
        (["paths.runs={tmp}/a?x"], {}, "holds '?', which SQLite's URL cannot carry"),
        (["hydra/sweeper=basic"], {}, "hydra/sweeper=basic: a stage runs through the cart_sweeps sweeper"),
        (["launcher._target_=nowhere.Pool"], {}, "launcher._target_=nowhere.Pool is no importable class"),
    ],
)
def test_what_cannot_succeed_is_one_line_before_launch(tmp_path, bad, extra_env, says):
    """Item 7: these were tracebacks after launch, a completed 1-step run, or runs 'completed' at inf."""
    (tmp_path / "a-file").write_text("")
    args = [b.format(tmp=tmp_path) for b in bad]
    extra = {k: v.format(tmp=tmp_path) for k, v in extra_env.items()}
    command = [sys.executable, "-m", "cart_sweeps", "-m", *GRID[:-1], *args]  # no defaults of these tests to win
    proc = subprocess.run(command, env=env(tmp_path, **extra), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout, proc.stderr + proc.stdout  # no log lines
    assert not (tmp_path / "1").exists()


UNSET = "CART_SWEEPS_TEST_UNSET"  # an environment variable no test sets
STAGE_1 = GRID[:-1]  # 20 steps at scale=tiny: its recipe's warm-up of 100 is 1
SEARCH = ["stage=lr", "scale=tiny", "sweep.sampler=tpe", "sweep.n_trials=2"]  # its lowest trainer.lr: 3e-4
VARIABLE_R = ["stage=variable_r", "scale=tiny", "stage.source={source}"]  # a source folder as test_identity's


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([*STAGE_1, "trainer.lr=inf"], "trainer.lr=inf must be > 0 and finite"),
        ([*STAGE_1, "trainer.weight_decay=nan"], "trainer.weight_decay=nan must be >= 0 and finite"),
        ([*STAGE_1, "trainer.min_lr=1e-2"], "trainer.min_lr=0.01 must be <= trainer.lr=0.003: the cosine decays"),
        ([*STAGE_1, "trainer.warmup_steps=20"], "trainer.warmup_steps=20 must be < trainer.steps=20: a warm-up"),
        ([*STAGE_1, "trainer.betas=[0.9,1.0]"], "trainer.betas=[0.9, 1.0] must be two numbers in [0, 1)"),
        ([*SEARCH, "trainer.min_lr=1e-3"], "trainer.min_lr=0.001 must be <= trainer.lr=0.0003"),  # a search's end
        ([*STAGE_1, f"trainer.lr=${{oc.env:{UNSET}}}"], f"trainer.lr: the environment variable {UNSET} is not set"),
        ([*STAGE_1, f"trainer.lr=1e-3,${{oc.env:{UNSET}}}"], f"trainer.lr: the environment variable {UNSET}"),
        ([*STAGE_1, f"logger.entity=${{oc.env:{UNSET}}}"], f"logger.entity: the environment variable {UNSET}"),
        ([*STAGE_1, "trainer.lr=${trainer.nope}"], "trainer.lr: Interpolation key 'trainer.nope' not found"),
        ([*VARIABLE_R, "stage.eval_n_loops=2,20"], "stage.eval_n_loops=20 must be in 1..16 (the loop-index table's"),
    ],
)
def test_a_value_no_run_can_mean_is_one_line_in_plan_and_the_driver(tmp_path, args, says):
    """Round 4: inf and nan passed their bounds, min_lr above lr and a warm-up as long as the run trained another
    schedule, an unset ${oc.env:X} was a 115-line traceback (or a run's failure, after launch), and so was an
    inference R past the loop-index table."""
    if any("{source}" in a for a in args):  # a trained run's folder, beside the runs root
        source = tmp_path.parent / f"{tmp_path.name}-source" / "d48-P6-R6-s42"
        source.parent.mkdir()
        completed_source(source)
        args = [a.format(source=source) for a in args]
    environment = {k: v for k, v in env(tmp_path).items() if k != UNSET}
    for command in (["cart_sweeps.plan", *args], ["cart_sweeps", "-m", *args]):
        proc = subprocess.run(
            [sys.executable, "-m", *command], env=environment, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2 and not proc.stdout and proc.stderr.startswith(f"error: {says}"), proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and not list(tmp_path.iterdir()), proc.stderr


def test_a_run_that_cannot_succeed_is_rejected_not_retried(tmp_path, data_cache):
    """Item 7: an error only a run can find (its data's vocabulary) is recorded once, not retried."""
    proc = sweep(tmp_path, *GRID, "model.vocab_size=100", "sweep.max_retries=2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    found = trials(tmp_path)
    assert len(found) == 2 and {t.user_attrs["status"] for t in found} == {"rejected"}
    assert all("raise model.vocab_size" in t.user_attrs["error"] for t in found)
    assert "0 completed, 0 failed, 0 diverged, 0 cancelled, 2 rejected" in proc.stderr


@pytest.mark.parametrize(
    ("sig", "says"),
    [
        (signal.SIGKILL, "killed by SIGKILL (the out-of-memory killer, or kill -9)"),
        (signal.SIGINT, "interrupted by SIGINT from outside the driver"),
    ],
    ids=["SIGKILL", "SIGINT"],
)
def test_a_task_killed_from_outside_says_why_and_is_not_retried(tmp_path, data_cache, sig, says):
    """Item 9: an OOM kill or a user's kill showed as 'Job N ... has not produced any output', and was retried."""
    mark = tmp_path / "mark"
    driver = subprocess.Popen(
        sweep_cmd(*GRID), env=with_fault(tmp_path, "step:pause:3:-R4-", mark), stderr=subprocess.PIPE, text=True
    )
    wait_for(mark.exists, 180, "R=4 to reach its third step")
    os.kill(int(mark.read_text()), sig)
    _, err = driver.communicate(timeout=180)
    assert driver.returncode == 1, err[-3000:]
    status = {t.params["model.n_loops"]: (t.user_attrs["status"], t.user_attrs.get("error")) for t in trials(tmp_path)}
    assert status == {2: ("completed", None), 4: ("cancelled", says)}  # one trial each: no retry
    line = next(line for line in err.splitlines() if line.startswith("d32-P2-R4"))
    assert "ppl_austen" not in line and says in line  # no stale metric beside the reason


def test_a_full_disk_is_named_and_not_retried(tmp_path, data_cache):
    """Item 9: a run that fills its disk fails every retry the same way; the reason must say so."""
    with small_disk(tmp_path / "small", "3m") as small:
        one_run = ["stage=1", "scale=tiny", "model.d_model=1024", "model.n_loops=4", "model.n_prelude=2"]
        proc = sweep(small, *one_run, "trainer.steps=20", "sweep.max_retries=2")  # an 8 MB checkpoint, 3 MB free
        assert proc.returncode == 1, proc.stderr[-3000:]
        (trial,) = trials(small)
        assert trial.user_attrs["status"] == "rejected" and "disk full at" in trial.user_attrs["error"]


def test_a_source_still_training_is_not_evaluated(tmp_path, data_cache):
    """Item 1: variable_r on a source still training recorded its newest checkpoint as the evaluation."""
    mark, source = tmp_path / "mark", tmp_path / "source"
    train = [sys.executable, "-m", "cart_sweeps", "scale=tiny", "model.d_model=32", "model.n_loops=2"]
    train += ["model.n_prelude=2", "trainer.steps=20"]
    train += ["trainer.ckpt_every=5", f"hydra.run.dir={source}"]
    training = subprocess.Popen(train, env=with_fault(tmp_path, "step:pause:12", mark), stdout=subprocess.DEVNULL)
    try:
        wait_for(mark.exists, 120, "the source to reach its 12th step")
        evaluate = ["stage=variable_r", "scale=tiny", f"stage.source={source}", "stage.eval_n_loops=2"]
        proc = sweep(tmp_path / "runs", *evaluate, "harness.tasks=[]", "sweep.metric=ppl_austen")
    finally:
        training.kill()
        training.wait(30)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert f"stage.source={source} is running at step 10, not completed" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_an_unknown_status_in_the_ledger_is_one_line(finished):
    """Item 5: a status this version does not know ('preempted', the ledger edited by hand) crashed plan and
    the driver: the stage could not be relaunched until the ledger was fixed by hand."""
    runs = finished
    with sqlite3.connect(runs / "1" / "ledger.db") as db:
        edit = "UPDATE trial_user_attributes SET value_json = ? WHERE key = 'status' AND trial_id = 1"
        db.execute(edit, ('"preempted"',))
    listed = plan(runs)
    assert listed.returncode == 0, listed.stderr[-3000:]
    unknown = [line for line in listed.stderr.splitlines() if "'preempted' is not one this version knows" in line]
    assert len(unknown) == 1 and "Traceback" not in listed.stderr, listed.stderr
    assert sorted(plan_status(listed.stdout).values()) == ["completed", "failed"]
    proc = sweep(runs, *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 done, skipped" in proc.stdout and "'preempted' is not one this version knows" in proc.stderr


def test_a_full_disk_under_the_ledger_is_one_line(tmp_path, data_cache):
    """Item 6: a full disk under the ledger was a 105-line traceback ending in 'invalid data in the commit'."""
    # room for a run (a run's pool calls less than 64 MiB free a full disk), then none
    with small_disk(tmp_path / "small", "80m") as small:
        first = sweep(small, *GRID[:2], "model.d_model=256", "model.n_loops=2", "model.n_prelude=2", "trainer.steps=5")
        assert first.returncode == 0, first.stderr[-3000:]
        subprocess.run(["dd", "if=/dev/zero", f"of={small / 'filler'}", "bs=64k"], capture_output=True)
        proc = sweep(small, *GRID[:2], "model.d_model=256", "model.n_loops=2", "model.n_prelude=2", "trainer.steps=6")
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
        assert f"ledger {small / '1' / 'ledger.db'} cannot be written (disk full at {small / '1'})" in proc.stderr
        (small / "filler").unlink()
        assert len(trials(small)) == 1  # what was recorded is kept


def test_a_killed_controller_stops_its_worker(tmp_path, data_cache):
    """Item 4: kill -9 of a worker's controller left its run training beside the slot's next worker, and an
    orphaned worker outlived the driver."""
    mark = tmp_path / "mark"
    three = [*GRID[:2], "model.d_model=256", "model.n_loops=2,4,6", "model.n_prelude=2", "trainer.steps=20"]
    driver = subprocess.Popen(
        sweep_cmd(*three), env=with_fault(tmp_path, "step:pause:3:-R4-", mark), stderr=subprocess.PIPE, text=True
    )
    wait_for(mark.exists, 180, "R=4 to reach its third step")
    run = int(mark.read_text())
    os.kill(os.getpgid(run), signal.SIGKILL)  # the controller leads its job's process group
    _, err = driver.communicate(timeout=180)
    assert driver.returncode == 1, err[-3000:]
    status = {
        t.params["model.n_loops"]: (t.user_attrs["status"], t.user_attrs.get("error", "")) for t in trials(tmp_path)
    }
    assert status[2][0] == status[6][0] == "completed"
    assert status[4][0] == "cancelled" and "controller" in status[4][1] and "was stopped" in status[4][1]
    (r4,) = (tmp_path / "1").glob("d32-P2-R4-*")
    assert json.loads((r4 / "summary.json").read_text())["status"] == "interrupted"  # stopped as on Ctrl-C
    wait_until_gone(tmp_path, 10)


def test_a_read_only_run_folder_is_named_and_not_retried(tmp_path, data_cache, monkeypatch):
    """Item 11: a run folder on a read-only file system was retried, though no retry can write it."""
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    one_run = [*GRID[:2], "model.d_model=256", "model.n_loops=2", "model.n_prelude=2", "trainer.steps=5"]
    (run,) = Stage(one_run).runs
    run.run_dir.mkdir(parents=True)
    with read_only(run.run_dir):
        proc = sweep(tmp_path, *one_run, "sweep.max_retries=2")
        assert proc.returncode == 1, proc.stderr[-3000:]
        (trial,) = trials(tmp_path)
        assert trial.user_attrs["status"] == "rejected", trial.user_attrs
        assert f"{run.run_dir} is not writable (read-only)" in trial.user_attrs["error"]


def test_two_runs_roots_launched_from_one_folder_keep_their_relative_storages_apart(tmp_path, data_cache):
    """Round 4: `sweep.storage=study.db` was a file in the working folder, so `paths.runs=A` and `paths.runs=B`
    launched from one folder shared one study: each saw the other's runs as lost and trained them again, and its
    analysis listed runs missing that its root never had. A relative storage is now in the runs root; one
    absolute file named for both is shared, as before."""
    one_run = [*GRID[:3], "model.n_loops=2", "model.n_prelude=2", "trainer.steps=2"]

    def launch(root: str, storage: str) -> subprocess.CompletedProcess[str]:
        command = sweep_cmd(*one_run, f"paths.runs={root}", f"sweep.storage={storage}")
        return subprocess.run(command, env=env(tmp_path / "unset"), cwd=tmp_path, capture_output=True, text=True)

    for root in ("A", "B"):
        proc = launch(root, "study.db")
        assert proc.returncode == 0 and "0 done, skipped" in proc.stdout and "lost" not in proc.stdout, proc.stdout
        recorded = json.loads((tmp_path / root / "1" / "stage.json").read_text())["storage"]
        assert recorded == str(tmp_path / root / "study.db") and Path(recorded).is_file()
    assert not (tmp_path / "study.db").exists()
    before = modified(tmp_path / "A")
    again = launch("A", "study.db")
    assert again.returncode == 0 and "1 done, skipped" in again.stdout and "lost" not in again.stdout, again.stdout
    assert modified(tmp_path / "A") == before  # nothing trained again
    chosen = stage_runs(tmp_path / "A", "1")
    assert (len(chosen.used), chosen.missing) == (1, [])

    shared = tmp_path / "shared.db"
    for root in ("C", "D"):
        assert launch(root, str(shared)).returncode == 0
        assert json.loads((tmp_path / root / "1" / "stage.json").read_text())["storage"] == str(shared)
    (ledger,) = Ledger.read_all(tmp_path / "C" / "1", "1", str(shared))
    assert [launch["number"] for launch in ledger.launches()] == [1, 2]  # one study, both roots' launches


def test_a_renamed_run_folder_is_named_with_the_command_that_puts_it_back(finished):
    """Round 4: `mv runs/1/<run> runs/1/mine` was listed as a copy, yet the relaunch trained its run again without
    naming it. Now, in the stage's folder or the runs root, the relaunch trains nothing for it and says in one line
    where the run is and the `mv` that puts it back; `plan` shows it moved; put back, it is done."""
    runs = finished
    before = modified(runs)
    run = next(p for p in (runs / "1").iterdir() if p.name.startswith("d32-P2-R4"))
    for mine, shown in ((runs / "1" / "mine", "mine"), (runs / "mine", "../mine")):
        run.rename(mine)
        assert plan_status(plan(runs).stdout) == {"d32-P2-R2-s42": "completed", "d32-P2-R4-s42": f"moved ({shown})"}
        proc = sweep(runs, *GRID)
        assert proc.returncode == 1, proc.stderr[-3000:]
        (line,) = [line for line in proc.stdout.splitlines() if str(mine) in line]
        assert f"put it back ({shlex.join(['mv', str(mine), str(run)])})" in line, line
        assert "lost" not in proc.stdout and len(trials(runs)) == 2  # no attempt started
        subprocess.run(["mv", str(mine), str(run)], check=True)
    again = sweep(runs, *GRID)
    assert again.returncode == 0 and "2 done, skipped" in again.stdout, again.stdout
    assert modified(runs) == before  # nothing trained again


def test_a_run_folder_holding_another_run_gets_a_fix_that_works_under_a_stage(finished):
    """Round 4: a run's folder holding another run's summary (a copy put back under the wrong name) had its run
    retried and rejected, advising `hydra.run.dir`, which a stage refuses: stuck for good. The relaunch now trains
    nothing for it and names the folder and the `mv` that clears it; the launch after that trains the run."""
    runs = finished
    r2, r4 = sorted(p for p in (runs / "1").iterdir() if p.name.startswith("d32-"))
    shutil.rmtree(r2)
    shutil.copytree(r4, r2)
    assert plan_status(plan(runs).stdout)["d32-P2-R2-s42"] == "occupied (d32-P2-R4-s42)"
    proc = sweep(runs, *GRID)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if str(r2) in line]
    aside = ["mv", str(r2), f"{r2}.aside"]
    assert "holds another run, d32-P2-R4-s42" in line and f"({shlex.join(aside)})" in line, line
    assert "hydra.run.dir" not in proc.stdout + proc.stderr and len(trials(runs)) == 2  # no attempt started
    subprocess.run(aside, check=True)
    again = sweep(runs, *GRID)
    assert again.returncode == 0 and "1 run the ledger holds as done lost their run folder" in again.stdout
    assert summaries(runs)[r2.name]["label"] == "d32-P2-R2-s42" and summaries(runs)[r2.name]["status"] == "completed"
