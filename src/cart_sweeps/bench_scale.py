"""`python -m cart_sweeps.bench_scale [--seeds N] [--one-step-seeds M]`: what the driver costs at scale.

Through the real commands, in a fresh folder, it prints:

- plan: `python -m cart_sweeps.plan stage=1 scale=tiny seed=range(0,N)` (64 x N runs): wall time and the
  process's peak memory;
- driver start: `python -m cart_sweeps -m` on that stage: seconds until its first run's folder appears,
  and the driver's peak memory by then (it is then interrupted);
- one-step runs: Stage 1 with `trainer.steps=1` and M seeds (64 x M runs) on 2 slots: runs per minute;
- relaunch: the same command again on the finished stage: seconds until it exits saying all is done.

Goals (issue 26): plan of 10,240 runs <= 5 s and <= 400 MB; the first run within 8 s at <= 400 MB; one-step
runs >= 200 a minute; a relaunch of a finished 1,024-run stage within 2 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGE = ["stage=1", "scale=tiny", "launcher.slots=2"]


def _peak_mb(pid: int) -> float:
    """A live process's peak resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run `command` to its end: (seconds, its peak resident memory in MB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"bench_scale: {' '.join(command)} failed (exit {proc.returncode})")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def plan(seeds: int, env: dict[str, str]) -> dict[str, float]:
    seconds, peak = _timed([sys.executable, "-m", "cart_sweeps.plan", *STAGE, f"seed=range(0,{seeds})"], env)
    return {f"plan_{64 * seeds}_runs_s": seconds, f"plan_{64 * seeds}_runs_peak_mb": peak}


def driver_start(seeds: int, runs: Path, env: dict[str, str]) -> dict[str, float]:
    """Seconds from the command to the first run's folder, and the driver's peak memory until then."""
    command = [sys.executable, "-m", "cart_sweeps", "-m", *STAGE, f"seed=range(0,{seeds})", "trainer.steps=1"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not any((runs / "1").glob("*/config.yaml")):
            if proc.poll() is not None:
                sys.exit(f"bench_scale: the driver exited ({proc.returncode}) before its first run")
            time.sleep(0.05)
        seconds, peak = time.perf_counter() - t0, _peak_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait()
    return {f"driver_{64 * seeds}_runs_first_run_s": seconds, f"driver_{64 * seeds}_runs_peak_mb": peak}


def one_step_runs(seeds: int, env: dict[str, str]) -> dict[str, float]:
    """A stage of one-step runs, then its relaunch (which must find all of it done)."""
    command = [sys.executable, "-m", "cart_sweeps", "-m", *STAGE, f"seed=range(0,{seeds})", "trainer.steps=1"]
    seconds, _ = _timed(command, env)
    again, _ = _timed(command, env)
    n = 64 * seeds
    return {"one_step_runs": n, "one_step_runs_per_min": n / seconds * 60, f"relaunch_{n}_done_runs_s": again}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cart_sweeps.bench_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=160, help="seeds for plan and driver start (x64 runs)")
    parser.add_argument("--one-step-seeds", type=int, default=16, help="seeds of the one-step stage (x64 runs)")
    args = parser.parse_args(argv)
    subprocess.run(
        [sys.executable, "-m", "cart_sweeps.data.prepare", "data=embedded"], check=True, stdout=subprocess.DEVNULL
    )
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        env = {**os.environ, "CART_SWEEPS_RUNS": str(Path(tmp) / "big")}
        figures |= plan(args.seeds, env)
        figures |= driver_start(args.seeds, Path(tmp) / "big", env)
        figures |= one_step_runs(args.one_step_seeds, {**os.environ, "CART_SWEEPS_RUNS": str(Path(tmp) / "small")})
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:.2f}" if isinstance(value, float) else f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
