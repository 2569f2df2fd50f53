"""A real wheel, installed into a fresh virtual environment, composes the study from any folder."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import hydra
import pytest

from cart_sweeps.config import REPO_ROOT


@pytest.mark.slow
def test_an_installed_wheel_plans_a_stage_from_any_folder(tmp_path):
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("cart_sweeps-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "cart_sweeps/conf/config.yaml" in names and "cart_sweeps/sweeps/1.yaml" in names
    assert "cart_sweeps/analysis/load.py" in names  # the analysis, for the dashboard and python -m
    assert not [n for n in names if n.startswith("analysis/")]  # no generic top-level name claimed

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = next((env_dir / "lib").glob("python*/site-packages"))
    (site / "deps.pth").write_text(str(Path(hydra.__file__).parents[1]) + "\n")  # torch, hydra, ... from here
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]

    folder = tmp_path / "elsewhere"
    folder.mkdir()
    plan = subprocess.run(
        [str(python), "-m", "cart_sweeps.plan", "stage=1", "scale=tiny", "plan.format=csv"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
    )
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert len(plan.stdout.splitlines()) == 1 + 64
    where = subprocess.run(
        [str(python), "-c", "import cart_sweeps.config as c; print(c.CONF_DIR)"],
        capture_output=True,
        text=True,
        cwd=folder,
    )
    assert where.stdout.strip() == str(site / "cart_sweeps" / "conf")
    dashboard = subprocess.run(
        [str(python), "-m", "cart_sweeps.dashboard", "stage=1", "scale=tiny"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
    )
    assert dashboard.returncode == 0 and "W&B report: those panels and the stage's tables" in dashboard.stdout, (
        dashboard.stderr[-3000:]
    )
