"""The GPU hand-out of launcher=local, on GPUs a stand-in nvidia-smi lists (tests/fixtures/standin_gpus).

The stand-in is a real executable on PATH that answers what cart_sweeps.hardware asks, in the real tool's
formats; the runs still train on the CPU (CUDA_VISIBLE_DEVICES names a GPU the CPU torch cannot see), so
what is tested is the driver's side: slots per GPU, packing refused by memory, and the GPU each run records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from stages import sweep, trials

from cart_sweeps.compose import compose_config
from cart_sweeps.hardware import gpu_memory_bytes, nvidia_gpus
from cart_sweeps.sweep.cost import memory_need_bytes
from cart_sweeps.sweep.expand import Stage
from cart_sweeps.sweep.pools.local import LocalPool

STANDIN = Path(__file__).parent / "fixtures" / "standin_gpus"
GRID = ["stage=1", "scale=tiny", "model.d_model=256,512", "model.n_loops=2,4", "model.n_prelude=2"]
MIB = 2**20


def gpu(n: int, memory_mib: int = 81_559, migs: tuple[str, ...] = ()) -> dict:
    return {
        "uuid": f"GPU-0000000{n}-aaaa-bbbb-cccc-00000000000{n}",
        "memory_mib": memory_mib,
        "mig": [{"profile": profile, "uuid": f"MIG-0000000{n}-{k}"} for k, profile in enumerate(migs)],
    }


def standin_env(gpus: list[dict], log: Path | None = None) -> dict[str, str]:
    """The environment under which nvidia-smi is the stand-in listing `gpus` (and no CUDA_VISIBLE_DEVICES)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(PATH=f"{STANDIN}{os.pathsep}{env['PATH']}", STANDIN_GPUS=json.dumps(gpus))
    return {**env, "STANDIN_GPUS_LOG": str(log)} if log else env


@pytest.fixture
def on_standin(monkeypatch):
    """This process sees the stand-in's GPUs (set for the test, restored after)."""

    def use(gpus: list[dict]) -> None:
        for key, value in standin_env(gpus).items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    return use


def test_devices_are_gpu_indices_or_their_mig_devices_with_their_memory(on_standin):
    on_standin([gpu(0, 24_576), gpu(1, 40_960, migs=("3g.20gb", "3g.20gb")), gpu(2, 81_559)])
    found = nvidia_gpus()
    assert [g.id for g in found] == ["0", "MIG-00000001-0", "MIG-00000001-1", "2"]
    assert [g.memory_bytes for g in found] == [24_576 * MIB, 20 * 10**9, 20 * 10**9, 81_559 * MIB]
    ids = ["2", gpu(0)["uuid"], "MIG-00000001-1", "GPU-unknown"]  # as CUDA_VISIBLE_DEVICES may name them
    assert gpu_memory_bytes(ids) == [81_559 * MIB, 24_576 * MIB, 20 * 10**9, None]


def test_no_nvidia_smi_or_no_gpus_is_no_devices(on_standin, monkeypatch):
    on_standin([])
    assert nvidia_gpus() == []
    monkeypatch.setenv("PATH", "/nonexistent")
    assert nvidia_gpus() == [] and gpu_memory_bytes(["0"]) == [None]


def test_a_slot_per_gpu_and_runs_per_gpu_slots_on_each(on_standin, tmp_path):
    on_standin([gpu(n) for n in range(3)])
    cfg = compose_config(["launcher.runs_per_gpu=2"])
    assert LocalPool.capacity_of(cfg.launcher) == 6
    assert [slot.gpu for slot in LocalPool(cfg, tmp_path).slots] == ["0", "0", "1", "1", "2", "2"]


@pytest.mark.slow  # over 3 s of the fast tier's 2 cores (issue 40: the fast tier <= 120 s)
def test_packing_beyond_a_gpus_memory_is_refused_before_launch(tmp_path):
    """The smallest GPU decides: two runs fit on GPU 0, not on the MIG device of GPU 1 beside it."""
    need = max(memory_need_bytes(run.config.cfg) for run in Stage(GRID).runs)
    gb = -(-3 * need // 2 // 10**9)  # a MIG profile of 1.5 runs' need: room for one run, not two
    gpus = [gpu(0, memory_mib=4 * need // MIB), gpu(1, migs=(f"1g.{gb}gb",))]
    command = [sys.executable, "-m", "cart_sweeps", "-m", *GRID, "launcher.runs_per_gpu=2"]
    env = {**standin_env(gpus), "CART_SWEEPS_RUNS": str(tmp_path)}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "lower launcher.runs_per_gpu" in proc.stderr, proc.stderr[-3000:]
    assert f"onto GPUs of {gb * 10**9 / 2**30:.0f} GiB" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "1").exists()


@pytest.mark.slow
def test_each_run_records_the_gpu_it_was_given(tmp_path, data_cache):
    """4 devices (2 GPUs, and a GPU split into 2 MIG devices): 4 runs, each on its own, each naming it."""
    gpus = [gpu(0), gpu(1), gpu(2, migs=("3g.40gb", "3g.40gb"))]
    proc = sweep(tmp_path, *GRID, "trainer.steps=10", **standin_env(gpus))  # as written: 10 steps
    assert proc.returncode == 0, proc.stderr[-3000:]
    given = [_given(t) for t in trials(tmp_path)]
    assert sorted(given) == ["0", "1", "MIG-00000002-0", "MIG-00000002-1"]


@pytest.mark.slow
def test_runs_packed_onto_a_gpu_record_the_gpu_they_shared(tmp_path, data_cache):
    log = tmp_path / "nvidia-smi.log"
    proc = sweep(tmp_path, *GRID, "trainer.steps=10", "launcher.runs_per_gpu=2", **standin_env([gpu(0), gpu(1)], log))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(_given(t) for t in trials(tmp_path)) == ["0", "0", "1", "1"]
    assert "--query-gpu=index,uuid,memory.total" in log.read_text()  # the packing was checked against memory


def _given(trial) -> str:
    summary = json.loads((Path(trial.user_attrs["run_dir"]) / "summary.json").read_text())
    return summary["env"]["cuda_visible_devices"]
