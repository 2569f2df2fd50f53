"""trainer.schedule=wsd and branch runs (docs/wsd.md): the schedule, the refusals, the scale's warm-up, and a
branch through the real command equal to a fresh run of its length, killed or not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_train import cli, killed_at_checkpoint, rows, summary

from cart_sweeps.compose import compose_config
from cart_sweeps.config import ConfigError, ScaleConfig
from cart_sweeps.data.hashes import file_sha256
from cart_sweeps.identity import run_id
from cart_sweeps.run import execute
from cart_sweeps.schedule import Decay, Schedule, branchable
from cart_sweeps.sweep.scale import to_scale
from cart_sweeps.validate import validate

WSD = ["scale=tiny", "trainer.schedule=wsd", "trainer.deterministic=true", "trainer.log_every=1"]


def trainer(*overrides: str):
    return compose_config([*WSD, *overrides]).trainer


@pytest.mark.parametrize("shape", ["sqrt", "linear"])
def test_wsd_warms_up_holds_then_decays_to_min_lr_over_its_last_fraction(shape):
    t = trainer("trainer.steps=50", "trainer.warmup_steps=5", f"trainer.decay_shape={shape}")
    schedule = Schedule.of(t)
    lrs = [schedule.lr_at(s) for s in range(t.steps)]
    assert schedule.decay_start == 40
    assert lrs[:5] == [t.lr * (s + 1) / 5 for s in range(5)]
    assert lrs[5:40] == [t.lr] * 35
    assert all(a > b for a, b in zip(lrs[39:], lrs[40:], strict=False)) and lrs[-1] == pytest.approx(t.min_lr)
    half = lrs[40 + 4]  # half-way through the decay's 10 steps (progress 0.5)
    drop = 0.5**0.5 if shape == "sqrt" else 0.5
    assert half == pytest.approx(t.min_lr + (t.lr - t.min_lr) * (1 - drop))


def test_the_cosine_is_the_warm_up_stable_decay_schedule_with_no_stable_phase():
    """One record for both schedules (as torchtitan's scheduler): the cosine decays from its warm-up's end, a wsd
    run from its last decay_fraction, and only the wsd's runs branch (docs/wsd.md)."""
    stated = ["trainer.steps=50", "trainer.warmup_steps=5"]
    cosine = Schedule.of(compose_config(["scale=tiny", *stated]).trainer)
    wsd = Schedule.of(trainer(*stated))
    assert (cosine.decay, cosine.decay_start, cosine.branchable) == (Decay.cosine, 5, False)
    assert (wsd.decay, wsd.decay_start, wsd.branchable) == (Decay.sqrt, 40, True)
    assert [branchable(v) for v in ("wsd", "cosine", "wsdd", None)] == [True, False, False, False]


def test_wsd_runs_of_two_lengths_share_every_step_before_the_shorter_ones_decay():
    short, long = Schedule.of(trainer("trainer.steps=30")), Schedule.of(trainer("trainer.steps=90"))
    assert [short.lr_at(s) for s in range(short.decay_start)] == [long.lr_at(s) for s in range(short.decay_start)]
    cosine = [Schedule.of(compose_config(["scale=tiny", f"trainer.steps={n}"]).trainer) for n in (30, 90)]
    assert cosine[0].lr_at(10) != cosine[1].lr_at(10)  # the paper's cosine: each length its own from the warm-up


def test_the_new_keys_keep_every_run_id_and_a_branch_is_the_run_it_equals():
    """Defaults leave ids alone (test_identity pins them); a branch's parent, step and kept checkpoints are where
    it came from, not what it computes, so a branch has the id of the fresh run it equals."""
    assert run_id(compose_config(["scale=tiny", "trainer.keep_checkpoints_at=[10]"])) == run_id(
        compose_config(["scale=tiny"])
    )
    wsd = run_id(compose_config(WSD))
    assert wsd != run_id(compose_config(WSD[:1] + WSD[2:]))
    branched = compose_config([*WSD, "trainer.branch_from=/somewhere", "trainer.branch_step=30"])
    assert run_id(branched) == wsd


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["scale=tiny", "trainer.branch_from=/p", "trainer.branch_step=10"], "the cosine spans a run's own length"),
        (
            [*WSD, "trainer.steps=30", "trainer.branch_from=/p", "trainer.branch_step=25"],
            "after this run's decay start",
        ),
        ([*WSD, "trainer.branch_step=10"], "needs the parent run: trainer.branch_from"),
        ([*WSD, "trainer.steps=30", "trainer.keep_checkpoints_at=[10,31]"], "step 31 is not in 1..trainer.steps=30"),
        ([*WSD, "trainer.steps=30", "trainer.warmup_steps=25"], "must be <= the decay start, step 24"),
        ([*WSD, "trainer.decay_fraction=1.5"], "trainer.decay_fraction=1.5 must be <= 1"),
    ],
)
def test_a_setting_that_cannot_branch_or_decay_is_one_line_before_any_launch(overrides, says):
    with pytest.raises(ConfigError, match=says) as err:
        validate(compose_config(overrides))
    assert "\n" not in str(err.value)


def _parent_folder(tmp_path: Path, *overrides: str) -> Path:
    """A run folder holding the config.yaml a run of `overrides` writes (no training: the refusals read only that)."""
    folder = tmp_path / "parent"
    folder.mkdir()
    OmegaConf.save(compose_config(list(overrides)), folder / "config.yaml", resolve=True)
    return folder


@pytest.mark.parametrize(
    ("parent", "says"),
    [
        (["scale=tiny", "trainer.steps=40"], "trainer.schedule=cosine: its learning rate followed a cosine"),
        ([*WSD, "trainer.steps=40", "model.n_loops=2"], "another run: its model.n_loops is 2, this run's 4"),
        ([*WSD, "trainer.steps=40", "trainer.lr=1e-3"], "another run: its trainer.lr is 0.001, this run's 0.003"),
        ([*WSD, "trainer.steps=40", "seed=7"], "another run: its seed is 7, this run's 42"),
        ([*WSD, "trainer.steps=40"], r"has no checkpoint at step 24 \(it holds none\); train the parent with"),
        ([*WSD, "trainer.steps=25"], "after parent's decay start \\(step 20 of its 25\\)"),
    ],
)
def test_a_parent_that_is_not_this_runs_past_is_refused_before_anything_is_written(tmp_path, parent, says):
    folder = _parent_folder(tmp_path, *parent)
    cfg = compose_config([*WSD, "trainer.steps=30", f"trainer.branch_from={folder}", "trainer.branch_step=24"])
    with pytest.raises(ConfigError, match=says) as err:
        execute(cfg, tmp_path / "branch")
    assert "\n" not in str(err.value) and not (tmp_path / "branch").exists()


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (
            "replaced",
            "a checkpoint that is damaged or replaced: its bytes no longer match the sha256 it was saved with",
        ),
        (
            "truncated",
            "a checkpoint that is damaged or replaced: its bytes no longer match the sha256 it was saved with",
        ),
        ("another_run", r"a checkpoint that is another run's \(\w+\), not its own \(\w+\)"),
    ],
)
def test_a_parent_checkpoint_that_is_not_what_it_saved_is_refused_with_a_fix_that_works(tmp_path, fault, says):
    """Was loaded without a word (another seed's weights under this run's parent_run_id); now checked as a resume
    checks its own: the meta's run and sha256 against the file, one line naming both ways on."""
    folder = _parent_folder(tmp_path, *WSD, "trainer.steps=40")
    kept = folder / "checkpoints" / "step_0000024.pt"
    kept.parent.mkdir()
    kept.write_bytes(b"the parent's weights at step 24")
    owner = run_id(compose_config([*WSD, "trainer.steps=40", "seed=7"])) if fault == "another_run" else None
    meta = {"run_id": owner or run_id(OmegaConf.load(folder / "config.yaml")), "sha256": file_sha256(kept)}
    kept.with_suffix(".json").write_text(json.dumps(meta))
    if fault == "replaced":
        kept.write_bytes(b"another seed's weights at step 24")
    elif fault == "truncated":
        kept.write_bytes(kept.read_bytes()[:10])
    cfg = compose_config([*WSD, "trainer.steps=30", f"trainer.branch_from={folder}", "trainer.branch_step=24"])
    with pytest.raises(ConfigError, match=says) as err:
        execute(cfg, tmp_path / "branch")
    assert "train this run fresh instead (drop trainer.branch_from" in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "branch").exists()


def test_a_stage_warms_up_its_wsd_runs_alike_at_every_horizon():
    """The tiny scale shrinks a cosine run's warm-up with its length (3,000 and 30,500 paper steps: 20 and 30
    tiny steps); a wsd run's only by the scale's divisor, so a short horizon's branch has its parent's warm-up."""
    scale = ScaleConfig(**OmegaConf.to_container(compose_config(["scale=tiny"]).scale))  # type: ignore[arg-type]
    paper = compose_config(["scale=paper"])

    def warmup(steps: int, schedule: str) -> int:
        stated = {"trainer.steps": steps, "trainer.warmup_steps": 1000, "trainer.schedule": schedule}
        return to_scale(stated, scale, lambda k: OmegaConf.select(paper, k), train=True)["trainer.warmup_steps"]

    assert warmup(3000, "cosine") != warmup(30500, "cosine")
    assert warmup(3000, "wsd") == warmup(10000, "wsd") == warmup(30500, "wsd") == 1000 // scale.steps_divisor


# The Must show (issue 41): a parent of T2 steps keeps its checkpoint at T1's decay start; a branch from it to T1
# steps must equal a fresh T1-step run, row for row. T1 = 15 (decay start 12), T2 = 20 (decay start 16).
SHOW = [*WSD, "trainer.eval_every=4", "trainer.ckpt_every=5"]


def _run(tmp_path: Path, name: str, *overrides: str) -> Path:
    folder = tmp_path / name
    out, _ = cli([*SHOW, *overrides, f"hydra.run.dir={folder}"]).communicate(timeout=600)
    assert summary(folder)["status"] == "completed", out
    return folder


def _from(folder: Path, step: int) -> list[dict]:
    """A fresh run's rows a branch at `step` writes: its eval at `step` (the same weights) and all after."""
    return [r for r in rows(folder) if r["step"] > step or (r["step"] == step and r["kind"] == "eval")]


FINAL = ("ppl_austen", "ppl_bible", "ppl_shakespeare", "ce_austen", "bpb_austen", "rho")


@pytest.mark.slow
def test_a_wsd_branch_equals_a_fresh_run_of_its_length_and_a_finished_run_trains_further(tmp_path, data_cache):
    parent = _run(tmp_path, "parent", "trainer.steps=20", "trainer.keep_checkpoints_at=[12]")
    assert sorted(p.name for p in (parent / "checkpoints").glob("*.pt")) == ["step_0000012.pt", "step_0000020.pt"]
    branch = _run(tmp_path, "branch", "trainer.steps=15", f"trainer.branch_from={parent}", "trainer.branch_step=12")
    fresh = _run(tmp_path, "fresh", "trainer.steps=15", "trainer.keep_final_optimizer=true")
    assert rows(branch) == _from(fresh, 12)  # the loss curve, lr and evals: equal to the bit on the CPU
    assert {k: summary(branch)[k] for k in FINAL} == {k: summary(fresh)[k] for k in FINAL}
    assert summary(branch)["run_id"] == summary(fresh)["run_id"]
    assert (summary(branch)["parent_run_id"], summary(branch)["branch_step"]) == (summary(parent)["run_id"], 12)
    # "Train this further": the finished 15-step run kept its decay start (keep_final_optimizer); continued to
    # 20 steps from there (branch_step defaults to the earlier decay start: the parent's) it is the fresh 20-step run.
    further = _run(tmp_path, "further", "trainer.steps=20", f"trainer.branch_from={fresh}")
    assert rows(further) == _from(parent, 12) and summary(further)["branch_step"] == 12
    # The kept checkpoint replaced by other weights of the parent (its step 20): one line, nothing written.
    kept = parent / "checkpoints" / "step_0000012.pt"
    kept.write_bytes((parent / "checkpoints" / "step_0000020.pt").read_bytes())
    args = [*SHOW, "trainer.steps=15", f"trainer.branch_from={parent}", f"hydra.run.dir={tmp_path / 'wrong'}"]
    out, _ = cli(args).communicate(timeout=600)
    assert out.startswith("error: ") and out.count("\n") == 1 and "damaged or replaced" in out, out
    assert not (tmp_path / "wrong" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_branch_killed_mid_way_resumes_to_the_same_numbers(tmp_path, data_cache):
    parent = _run(tmp_path, "parent", "trainer.steps=20", "trainer.keep_checkpoints_at=[12]")
    fresh = _run(tmp_path, "fresh", "trainer.steps=15")
    folder = tmp_path / "branch"
    args = [
        *SHOW,
        "trainer.steps=15",
        "trainer.ckpt_every=1",
        f"trainer.branch_from={parent}",
        f"hydra.run.dir={folder}",
    ]
    killed_at_checkpoint(args, folder, 13, 300)  # at a checkpoint of its own, mid-way
    out, _ = cli(args).communicate(timeout=600)
    assert "resuming from step 1" in out and "branching" not in out
    assert rows(folder) == _from(fresh, 12)
    assert {k: summary(folder)[k] for k in FINAL} == {k: summary(fresh)[k] for k in FINAL}
    assert json.loads((folder / "summary.json").read_text())["parent_run_id"] == summary(parent)["run_id"]


def test_the_analysis_replays_a_wsd_runs_schedule():
    """The gate's weight-decay-only drift (analysis.stats) is computed from the schedule the run trained with."""
    import pandas as pd

    from cart_sweeps.analysis.stats import lr_schedule, recipe_of

    t = trainer("trainer.steps=30", "trainer.decay_shape=linear")
    stated = {k: t[k] for k in ("steps", "lr", "min_lr", "warmup_steps", "decay_fraction")}
    row = pd.Series({"step": 30, **stated, "schedule": "wsd", "decay_shape": "linear"})  # as load_runs frames it
    assert list(lr_schedule(recipe_of(row))) == [Schedule.of(t).lr_at(s) for s in range(30)]
