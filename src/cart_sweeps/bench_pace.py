"""`python -m cart_sweeps.bench_pace`: the phases of a tiny run on this machine, one JSON line: what `plan`'s pace
(sweep/pace.py) reads where no run has finished here yet. Its imports as a worker's (torch._dynamo too), then a
run's own phases: composing its config, building its model and optimizer (a second time: the first imports what a
worker imports once), training steps on random tokens (one thread), saving a checkpoint.
"""

from __future__ import annotations

import json
import tempfile
import time

import torch
import torch._dynamo  # noqa: F401 - a worker's preload (sweep/pools/local.py): its import is the worker's start

from cart_sweeps.bench import random_steps
from cart_sweeps.compose import compose_config
from cart_sweeps.model import train_flops_per_token
from cart_sweeps.train.setup import build_state, configure_torch

TINY = ["scale=tiny", "model.d_model=32", "trainer.threads=1"]
WARMUP, STEPS = 2, 8


def phases() -> dict[str, float]:
    began = time.perf_counter()
    cfg = compose_config(TINY)
    composed = time.perf_counter()
    device, dtype = configure_torch(cfg)
    build_state(cfg, device)  # its first build imports the rest once, as a worker's first run does
    rebuilt = time.perf_counter()
    state = build_state(cfg, device)
    built = time.perf_counter()
    t = cfg.trainer
    steps = random_steps(cfg, state, device, dtype)
    steps(WARMUP)
    start = time.perf_counter()
    steps(STEPS)
    trained = time.perf_counter()
    with tempfile.TemporaryFile() as f:
        torch.save({"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()}, f)
    saved = time.perf_counter()
    tokens_per_s = STEPS * t.micro_batch_size * t.seq_len / (trained - start)
    return {
        "compose_s": composed - began,
        "first_build_s": rebuilt - composed,
        "setup_s": built - rebuilt,
        "warmup_s": start - built,
        "steps_s": trained - start,
        "checkpoint_s": saved - trained,
        "flops_per_s": tokens_per_s * train_flops_per_token(cfg.model, t.seq_len),
    }


def main() -> None:
    print(json.dumps(phases()))


if __name__ == "__main__":
    main()
