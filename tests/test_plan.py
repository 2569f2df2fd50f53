"""`python -m cart_sweeps.plan`: the study's stages expand to the paper's runs, costed, without launching."""

from __future__ import annotations

import csv
import gc
import io
import itertools
import json
import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from cart_sweeps import plan
from cart_sweeps.compose import SEARCHPATH_ENV, compose_config
from cart_sweeps.config import ConfigError
from cart_sweeps.identity import run_id
from cart_sweeps.naming import run_label
from cart_sweeps.record.runfolder import write_summary
from cart_sweeps.record.summary import RunSummary
from cart_sweeps.stagerecord.ledger import Ledger
from cart_sweeps.sweep.expand import Stage

# REFERENCE section 5: Stage 1 PPL_wiki at step 3,000 with P=6 (d -> R -> ppl).
STAGE1_P6 = {
    256: {2: 185.7, 4: 185.3, 6: 184.9, 8: 186.2},
    512: {2: 138.8, 4: 137.9, 6: 137.4, 8: 136.4},
    768: {2: 118.3, 4: 116.4, 6: 116.0, 8: 115.0},
    1024: {2: 103.1, 4: 101.1, 6: 98.75, 8: 97.73},
}


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CART_SWEEPS_RUNS", str(tmp_path))
    return tmp_path


def axis(stage: Stage, key: str) -> set:
    return {run.seed if key == "seed" else OmegaConf.select(run.config.cfg, key) for run in stage.runs}


def test_stage1_is_the_papers_screen(runs_dir):
    stage = Stage(["stage=1"])
    assert len(stage.runs) == 64 == len({r.run_id for r in stage.runs}) == len({r.run_dir for r in stage.runs})
    points = {
        (r.config.cfg.model.d_model, r.config.cfg.model.n_loops, r.config.cfg.model.n_prelude) for r in stage.runs
    }
    assert points == set(itertools.product([256, 512, 768, 1024], [2, 4, 6, 8], [2, 3, 4, 6]))
    for run in stage.runs:
        t = run.config.cfg.trainer
        assert (run.seed, t.steps, t.seq_len, t.micro_batch_size * t.grad_accum * t.seq_len) == (
            42,
            3000,
            512,
            16384,
        )
        assert run.run_dir.parent == runs_dir / "1" and run.run_dir.name == f"{run.label}-{run.run_id[:8]}"


def test_stage2_is_the_papers_confirmation(runs_dir):
    stage = Stage(["stage=2"])
    assert len(stage.runs) == 36 == len({r.run_id for r in stage.runs})
    assert axis(stage, "model.n_prelude") == {6} and axis(stage, "model.n_loops") == {6, 8, 10}
    assert axis(stage, "seed") == {42, 137, 271} and axis(stage, "model.d_model") == {256, 512, 768, 1024}
    t = stage.runs[0].config.cfg.trainer
    assert (t.steps, t.seq_len, t.micro_batch_size, t.grad_accum) == (30500, 1024, 8, 4)


def test_parity_derives_the_dense_depths(runs_dir):
    stage = Stage(["stage=parity"])
    depths = {
        r.params["variant"]: r.config.cfg.model.n_layers for r in stage.runs if r.config.cfg.model.name == "dense"
    }
    assert depths == {"dense_stored": 7, "dense_effective": 12}
    assert len(stage.runs) == 9 and axis(stage, "model.d_model") == {1024}


def test_ablations_and_scale_tiny(runs_dir):
    stage = Stage(["stage=ablations", "scale=tiny"])
    assert len(stage.runs) == 8 == len({r.run_id for r in stage.runs})
    t = stage.runs[0].config.cfg.trainer
    assert (t.steps, t.seq_len, t.warmup_steps, t.log_every) == (30, 128, 1, 1)
    # the paper's 8 sequences x 4 accumulation steps, shrunk to 2 x 4, run as one micro-batch of 8 (same windows)
    assert (t.micro_batch_size, t.grad_accum) == (8, 1)
    assert (t.eval_every, t.ckpt_every) == (20, 5)  # scale.eval_every; 5,000 x 30 / 30,500
    assert axis(stage, "model.d_model") == {96} and stage.runs[0].config.cfg.model.max_seq_len == 128


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_planned_ids_are_the_ids_run_job_computes(runs_dir):
    """The fast composer must agree with compose_config, which run_job uses."""
    for args in (["stage=1", "scale=tiny"], ["stage=parity"]):
        for run in Stage(args).runs[::5]:
            assert run_id(compose_config(run.overrides)) == run.run_id


def test_the_seeds_of_a_configuration_are_named_as_their_own_composition_names_them(runs_dir):
    """A stage composes each configuration once and names its other seeds from it (64 configurations x 160
    seeds hold 64 configs); a configuration that reads the seed (an interpolation) is composed per seed."""
    plain = Stage(["stage=2", "scale=tiny", "model.d_model=256"])
    reading = Stage(["stage=2", "scale=tiny", "model.d_model=256", "data.validation.0.shuffle_seed=${seed}"])
    for stage in (plain, reading):
        for run in stage.runs:
            cfg = compose_config(run.overrides)
            assert (run.run_id, run.label, run.seed) == (run_id(cfg), run_label(cfg), cfg.seed)
    assert len(plain.runs) == 9 and len({id(run.config) for run in plain.runs}) == 3
    assert len({run.run_id for run in reading.runs}) == 9 and len({id(run.config) for run in reading.runs}) == 9


def test_a_config_option_that_reads_the_seed_names_each_seed_from_its_own_composition(runs_dir, tmp_path, monkeypatch):
    """The seed read through an interpolation in a group option (here a user's data option), not an override:
    each seed is composed, and named, as its own process would."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "reseeded.yaml").write_text(
        "defaults: [embedded, _self_]\ntokenizer:\n  name: embedded-bpe-s${seed}\n"
    )
    monkeypatch.setenv(SEARCHPATH_ENV, json.dumps([f"file://{tmp_path}"]))
    stage = Stage(["stage=2", "scale=tiny", "model.d_model=256", "data=reseeded"])
    for run in stage.runs:
        cfg = compose_config(run.overrides)
        assert cfg.data.tokenizer.name == f"embedded-bpe-s{run.seed}"
        assert (run.run_id, run.label) == (run_id(cfg), run_label(cfg))
    assert len({run.run_id for run in stage.runs}) == len({id(run.config) for run in stage.runs}) == 9


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_commands_check_and_its_stage_compose_a_base_once_and_an_edited_option_is_read_again(
    runs_dir, tmp_path, monkeypatch
):
    """The command line's check (precheck) and its stage share the bases they compose; a config file edited
    between two compositions of one process (a notebook, a test) is composed again, as a new process would."""
    from cart_sweeps import composer
    from cart_sweeps.__main__ import precheck
    from cart_sweeps.compose import parse_overrides

    (tmp_path / "model").mkdir()
    preset = tmp_path / "model" / "mine.yaml"
    preset.write_text("defaults: [cart, _self_]\ncore_update: reference\n")
    monkeypatch.setenv(SEARCHPATH_ENV, json.dumps([f"file://{tmp_path}"]))
    composed: list[tuple[str, ...]] = []

    def counted(groups: tuple[str, ...]):
        composed.append(tuple(groups))
        return compose_config(groups)

    monkeypatch.setattr(composer, "compose_config", counted)
    args = ["stage=1", "scale=tiny", "model=mine", "model.n_loops=2", "seed=1,2"]
    precheck(parse_overrides(args))
    stage = Stage(args)
    assert composed.count(("stage='1'", "scale=tiny", "model=mine")) == 1 and len(stage.runs) == 32
    assert {run.config.cfg.model.core_update for run in stage.runs} == {"reference"}

    preset.write_text("defaults: [cart, _self_]\ncore_update: paper\n")
    edited = Stage(args)
    assert {run.config.cfg.model.core_update for run in edited.runs} == {"paper"}
    assert [run.run_id for run in edited.runs] == [run_id(compose_config(run.overrides)) for run in edited.runs]


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_a_stage_and_its_drivers_history_are_built_without_the_collector_walking_them(runs_dir, tmp_path):
    """What a launch keeps to its end (the stage's configurations and runs, the ledger's history of its trials) is
    built with the collector paused and then moved to its oldest generation: no collection walks it as it is made
    (0.2 s of a 2.3 s relaunch of 1,024 finished runs went to such collections)."""
    from cart_sweeps.sweep.driver import StageDriver
    from cart_sweeps.sweep.pool import make_pool

    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        started.extend([info["generation"]] if phase == "start" else [])

    stage = Stage(["stage=1", "scale=tiny"])  # composes and caches its bases: the next build is a relaunch's
    ledger = Ledger.open(stage.sweep_dir, stage.name, "sqlite")
    for run in stage.runs:
        ledger.start(run.params, stage.dists(run.params), {"run_id": run.run_id, "label": run.label})
    pool = make_pool(stage.base, tmp_path / ".submitit")
    gc.collect()
    gc.callbacks.append(count)
    try:
        again = Stage(["stage=1", "scale=tiny"])
        after_stage = gc.get_count()[0]
        driver = StageDriver(again, ledger, pool, [])
        after_driver = gc.get_count()[0]
    finally:
        gc.callbacks.remove(count)
    assert started == [] and after_stage < 100 and after_driver < 100
    assert len(driver.queue) == len(again.runs) == 64  # each run's trial was read: cut off, resumed


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.lr={lr}", "model.n_loops={loops}", "++trainer.lr=1e-3"],  # one key twice: the last wins
        ["++scale.paper={{at:{{r:1}}}}", "scale.paper.at.r={lr}", "++scale.paper={{at:{{r:{loops}}}}}"],  # under a dict
        ["model.n_loops={loops}", "++scale.paper={{trainer.lr:{lr}}}", "data.validation=[]", "seed=${{model.n_loops}}"],
    ],
)
def test_a_composers_configs_are_hydras_whatever_their_overrides_share(runs_dir, overrides):
    """The composer applies a configuration's own assignments to what its siblings share (composed once): the
    configs are still exactly Hydra's, for assignments beside, after and under the overrides they share."""
    from cart_sweeps.composer import Composer

    composer = Composer()
    for loops, lr in [(2, 0.1), (3, 0.2), (4, 0.3), (4, 0.3)]:  # the third and fourth reuse what the first two share
        args = ["stage=1", "scale=tiny", *(o.format(loops=loops, lr=lr) for o in overrides)]
        assert OmegaConf.to_yaml(composer(args)) == OmegaConf.to_yaml(compose_config(args)), args


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_every_config_a_stage_composes_is_hydras(runs_dir):
    """Every configuration of a grid stage, as the stage composes it (at the seed of its first run), is the config
    `compose_config` (run_job's) gives for that run's overrides, key for key."""
    for args in (["stage=1", "scale=tiny"], ["stage=parity", "scale=tiny"], ["stage=ablations"]):
        firsts = [run for run in Stage(args).runs if run.seed == run.config.cfg.seed]
        assert len({id(run.config) for run in firsts}) == len(firsts) > 1
        for run in firsts[::4]:  # each configuration of parity and ablations, every fourth of Stage 1's 64
            assert OmegaConf.to_yaml(run.config.cfg) == OmegaConf.to_yaml(compose_config(run.overrides)), run.label


def test_memoized_ids_follow_a_value_read_through_an_interpolation(runs_dir):
    """The composer computes each group's part of a run id once per content; model.vocab_size reads
    data.tokenizer.vocab_size, so runs that differ only there differ in their model part too."""
    stage = Stage(
        ["stage=1", "scale=tiny", "model.n_prelude=2", "model.n_loops=2", "data.tokenizer.vocab_size=300,400"]
    )
    assert {run.config.cfg.model.vocab_size for run in stage.runs} == {300, 400}
    assert [run.run_id for run in stage.runs] == [run_id(stage.compose(run.overrides)) for run in stage.runs]


def test_command_line_grid_replaces_axes(runs_dir):
    stage = Stage(["stage=1", "scale=tiny", "model.d_model=256,512", "model.n_loops=2", "trainer.lr=1e-3,2e-3"])
    assert len(stage.runs) == 2 * 1 * 4 * 2
    assert axis(stage, "model.d_model") == {32, 48} and axis(stage, "trainer.lr") == {1e-3, 2e-3}


def test_csv_format(runs_dir, capsys):
    plan.main(["stage=parity", "plan.format=csv", "plan.gpu=rtx3090"])
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(rows[0]) == plan.COLUMNS and len(rows) == 9
    assert {r["status"] for r in rows} == {"new"}
    assert sum(float(r["gpu_hours"]) for r in rows) > 0
    hours = [float(r["gpu_hours"]) for r in rows]
    assert hours == sorted(hours, reverse=True)  # the driver's launch order: longest first


def test_table_reports_totals(runs_dir, capsys):
    plan.main(["stage=2", "plan.gpu=rtx3090", "plan.slots=8"])
    out = capsys.readouterr().out
    assert "36 runs" in out and "GPU-days" in out and "rtx3090" in out
    found = re.search(r"makespan on 8 slots: .* \(([\d.]+)x the lower bound .* grid order: .* \(([\d.]+)x\)", out)
    assert found, out[-500:]
    launch, grid = map(float, found.groups())
    assert launch < 1.02 < 1.2 < grid  # issue 13: longest first 1.010x, grid order 1.28x on 8 GPUs


@pytest.mark.slow  # a 64-trial ledger written, then Stage 2 expanded from it
def test_zoom_selects_from_the_stage1_ledger(runs_dir):
    """Stage-1 results (the paper's, P=6 best) in a real Optuna ledger and the run folders it names -> the
    author's zoom candidates."""
    s1 = Stage(["stage=1"])
    ledger = Ledger.open(s1.sweep_dir, "1", "sqlite", sampler=None)
    for run in s1.runs:
        d, r, p = (run.params[k] for k in ("model.d_model", "model.n_loops", "model.n_prelude"))
        attrs = {"run_id": run.run_id, "label": run.label, "run_dir": str(run.run_dir)}
        trial = ledger.start(run.params, s1.dists(run.params), attrs)
        ppl = STAGE1_P6[d][r] + (6 - p) * 10
        summary = RunSummary.from_dict({"status": "completed", "run_id": run.run_id, "ppl_wiki": ppl})
        run.run_dir.mkdir(parents=True)
        OmegaConf.save(run.config.cfg, run.run_dir / "config.yaml")  # the screen's horizon: 3,000 paper steps
        write_summary(run.run_dir, summary)
        ledger.finish(trial, summary, "ppl_wiki")
    zoom = Stage(["stage=2", "stage.select=zoom"])
    points = {(r.config.cfg.model.d_model, r.config.cfg.model.n_loops, r.config.cfg.model.n_prelude) for r in zoom.runs}
    # the cross, and every R at P=6 within the threshold: 0.73% x ln(30,500 / 3,000) = 1.69% plus, at Holm's
    # last three steps (every P < 6 is 8% or more behind), 2.39 / 2.24 / 1.96 x 0.5% x sqrt(2) = 3.39 / 3.28 / 3.08%
    assert {(r, p) for d, r, p in points if d == 1024} == {(8, 6), (6, 6), (10, 6), (8, 4), (8, 8)}  # R=4: 3.39%
    assert {(r, p) for d, r, p in points if d == 768} == {(2, 6), (4, 6), (6, 6), (8, 6), (10, 6), (8, 4), (8, 8)}
    assert {(r, p) for d, r, p in points if d == 256} == {(2, 6), (6, 6), (4, 6), (8, 6), (6, 4), (6, 8)}
    assert len(zoom.runs) == (5 + 7 + 7 + 6) * 3
    with pytest.raises(ConfigError, match=re.escape("stage 2 has 75 runs (25 zoom candidates x 3 seed)")):
        Stage(["stage=2", "stage.select=zoom", "stage.max_runs=74"])  # counted once its candidates are known


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["stage=1", "foo=1"], "foo"),
        (["stage=1", "trainer.steps=abc"], "abc"),
        (["stage=1", "model.d_model=1000"], "multiple of model.head_dim"),
        (["stage=1", "scale=tiny", "model.d_model=100"], "is neither a paper width"),
        (["stage=1", "model.n_loops=0"], "model.n_loops=0"),
        (["stage=nope"], "nope"),
        ([], "stage=<name>"),
        (["stage=1", "plan.gpu=tpu"], "plan.gpu"),
        (["stage=1", "plan.slots=0"], "plan.slots"),
    ],
)
def test_bad_input_is_one_line(runs_dir, capsys, args, says):
    with pytest.raises(SystemExit) as exit_:
        plan.run_cli(plan.main, plan.USAGE, args)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and says in err
    assert not any(runs_dir.iterdir())  # nothing created, nothing launched


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_command_line(runs_dir):
    env = {**os.environ, "CART_SWEEPS_RUNS": str(runs_dir)}
    help_ = subprocess.run(
        [sys.executable, "-m", "cart_sweeps.plan", "--help"], capture_output=True, text=True, env=env
    )
    assert help_.returncode == 0 and "plan.gpu" in help_.stdout
    out = subprocess.run(
        [sys.executable, "-m", "cart_sweeps.plan", "stage=ablations", "plan.format=csv"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == ",".join(plan.COLUMNS) and len(out.stdout.splitlines()) == 9


def test_the_driver_and_plan_import_no_torch():
    """Planning and driving a stage never pay torch's import (2 s here) nor touch CUDA; only a run's job does."""
    modules = "cart_sweeps.sweep.driver, cart_sweeps.plan, hydra_plugins.cart_sweeps_plugins.sweeper"
    code = f"import sys, {modules}; sys.exit('imported torch' if 'torch' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
