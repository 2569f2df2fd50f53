"""Each run counts once, as what it is: a property over generated run sets (a seeded generator of run folders
as the trainer writes them). Duplicating any run into any stage's folder, renaming a variant's folder, or
reading the same run through several stages never changes a table, a p-value or a decision; and the ablations
table, checked against values computed by hand from the run folders, has every switch (single_loop too), the
base configuration's own value as its base, and noise from each distinct run of that configuration once."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from cart_sweeps.analysis.load import load_runs
from cart_sweeps.analysis.report import run

SETS = ("ppl_austen", "ppl_bible")
BASE = {"d": 48, "p": 6, "r": 6}
SWITCHES = {  # the ablations stage's variants: name -> (model fields, the config's own label)
    "base": ({}, "base"),
    "unfreeze_kv": ({"unfreeze_kv": True}, "unfreeze_kv"),
    "single_loop": ({"n_loops": 1}, "base"),  # an override, not an ablation field: its config's label is "base"
    "disable_lti": ({"disable_lti": True}, "disable_lti"),
}


def run_id(config: str, seed: int) -> str:
    return hashlib.sha256(f"{config}/{seed}".encode()).hexdigest()[:16]


def write(root: Path, stage: str, rng: np.random.Generator, seed: int, **model: Any) -> Path:
    """One run folder, `<label>-<id8>`, holding its summary.json and a metrics.jsonl with one earlier evaluation.
    The metrics are a function of the configuration and seed alone: the same run trained by two stages (one
    run id) holds the same numbers."""
    model = {"name": "cart", "d_model": 48, "n_prelude": 6, "n_loops": 6, "n_layers": 4, **model}
    stage_variant = model.pop("stage_variant", None)
    switches = [k for k in ("unfreeze_kv", "disable_lti") if model.get(k)]
    config = json.dumps(model, sort_keys=True)
    rid = run_id(config, seed)
    dense = model["name"] == "dense"
    name = f"dense-d{model['d_model']}-L{model['n_layers']}" if dense else "d{d_model}-P{n_prelude}-R{n_loops}"
    label = name.format(**model) + "".join(f"-{s}" for s in switches) + f"-s{seed}"
    folder = root / stage / f"{label}-{rid[:8]}"
    folder.mkdir(parents=True)
    noise = np.random.default_rng(int(rid[:8], 16)).normal(0, 0.01, len(SETS))  # per run, not per draw
    level = 300 * 48 / model["d_model"] * (1 + 0.02 * abs(model["n_loops"] - 5)) * (1.03 if switches else 1)
    metrics = {s: float(level * (1 + 0.1 * i) * np.exp(n)) for i, (s, n) in enumerate(zip(SETS, noise, strict=True))}
    summary = {
        "status": "completed",
        "stage": stage,
        "run_id": rid,
        "config_id": hashlib.sha256(config.encode()).hexdigest()[:16],
        "label": label,
        "variant": "+".join(switches) or "base",
        **({"stage_variant": stage_variant} if stage_variant else {}),
        "seed": seed,
        "step": 40,
        "model": model,
        "trainer": {"steps": 40, "lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 4, "weight_decay": 0.1},
        "rho": None if dense else 0.89,
        **metrics,
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    early = {"step": 20, "kind": "eval", **{s: v * 1.5 for s, v in metrics.items()}}
    (folder / "metrics.jsonl").write_text(json.dumps(early) + "\n")
    return folder


def world(root: Path, seed: int, parity_reads_base: bool = True) -> Path:
    """Stages 1, 2, parity and ablations as folders without ledgers (run folders copied away from their ledgers
    read so), with the old layout of a shared run: the base configuration's seed 42 trained by stage 2, the
    ablations and (`parity_reads_base`) parity, each into its own folder under one run id."""
    rng = np.random.default_rng(seed)
    for d in (32, 48):
        for p in (2, 6):
            for r in (2, 6):
                write(root, "1", rng, 42, d_model=d, n_prelude=p, n_loops=r)
        for r in (6, 8):
            for s in (42, 137, 271):
                write(root, "2", rng, s, d_model=d, n_loops=r)
    for s in (42, 137) if parity_reads_base else (137,):
        write(root, "parity", rng, s)
    for s in (42, 137):
        for layers in (3, 6):
            write(root, "parity", rng, s, name="dense", n_layers=layers)
    for variant, (fields, _) in SWITCHES.items():
        write(root, "ablations", rng, 42, stage_variant=variant, **fields)
    return root


def analysed(root: Path, out: Path) -> dict[str, Any]:
    """Every table (CSV) and every decision of the analysis of `root`."""
    report = run(load_runs(root), out)
    tables = {p.stem: pd.read_csv(p) for p in sorted(out.glob("*.csv"))}
    keys = ("claim", "stage", "cell", "choice", "decided", "tied", "p_value", "margin", "seeds", "means", "noise")
    decisions = [{k: d[k] for k in keys} for d in report.findings["decisions"]]
    return {"tables": tables, "decisions": decisions}


def same(a: dict[str, Any], b: dict[str, Any], tables: list[str] | None = None) -> None:
    names = tables or sorted(a["tables"])
    assert names and [n for n in names if n in b["tables"]] == names
    for name in names:
        pd.testing.assert_frame_equal(a["tables"][name], b["tables"][name], check_exact=True, obj=name)
    claims = [d for d in a["decisions"] if tables is None or d["claim"] == "ablation"]
    assert claims == [d for d in b["decisions"] if tables is None or d["claim"] == "ablation"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    root = world(tmp_path_factory.mktemp("world") / "runs", 0)
    return root, analysed(root, root.parent / "out")


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_the_ablations_table_equals_the_run_folders_by_hand(baseline):
    root, result = baseline
    table = result["tables"]["ablations"]
    assert sorted(set(table["variant"])) == ["disable_lti", "single_loop", "unfreeze_kv"]
    summaries = [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]
    [base] = [s for s in summaries if s["stage"] == "ablations" and s.get("stage_variant") == "base"]
    distinct = {s["run_id"]: s for s in summaries if s["config_id"] == base["config_id"]}  # each run once
    assert sorted(s["seed"] for s in distinct.values()) == [42, 137, 271]  # s42 is 3 folders, 1 run
    for metric in SETS:
        rows = table[table["metric"] == metric].set_index("variant")
        assert (rows["base"] == base[metric]).all()  # the base configuration's value, never mixed with R=1
        [single] = [s for s in summaries if s.get("stage_variant") == "single_loop"]
        assert rows.loc["single_loop", "value"] == single[metric]
        spread = pd.Series([s[metric] for s in distinct.values()]).std()
        assert rows["base_seed_std"].tolist() == pytest.approx([spread] * 3) and (rows["base_seeds"] == 3).all()
    ablation = [d for d in result["decisions"] if d["claim"] == "ablation"]
    assert len(ablation) == 3 * len(SETS) and {d["noise"]["df"] for d in ablation} == {len(distinct) - 1}


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize("case", range(6))
def test_duplicating_any_run_into_any_stage_changes_nothing(baseline, tmp_path, case):
    root, before = baseline
    rng = np.random.default_rng(100 + case)
    copy = tmp_path / "runs"
    shutil.copytree(root, copy)
    folders = sorted(p.parent for p in copy.rglob("summary.json"))
    for _ in range(3):  # three copies a world: into its own stage under another name, or another stage's
        source = folders[rng.integers(len(folders))]
        stage = ["1", "2", "parity", "ablations"][rng.integers(4)]
        target = copy / stage / source.name
        shutil.copytree(source, target if not target.exists() else target.with_name(f"{source.name}.bak"))
    same(before, analysed(copy, tmp_path / "out"))


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
@pytest.mark.parametrize("case", range(3))
def test_renaming_a_variant_folder_changes_nothing(baseline, tmp_path, case):
    root, before = baseline
    copy = tmp_path / "runs"
    shutil.copytree(root, copy)
    variants = sorted(p for p in (copy / "ablations").iterdir())
    renamed = variants[np.random.default_rng(200 + case).integers(len(variants))]
    renamed.rename(renamed.with_name(f"renamed-{case}"))
    same(before, analysed(copy, tmp_path / "out"))


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_reading_the_same_run_through_more_stages_changes_no_table_that_pools_them(tmp_path, baseline):
    """The base's seed 42 read by stage 2 and the ablations only, or by parity too: the ablations' table, noise
    and decisions are the same (they were counted once per stage: one run as two seeds, p 20-60x too small)."""
    _, more = baseline
    fewer = analysed(world(tmp_path / "runs", 0, parity_reads_base=False), tmp_path / "out")
    same(fewer, more, tables=["ablations"])
