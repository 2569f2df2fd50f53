"""`python -m cart_sweeps.bench [overrides]`: time training steps of the composed model; one JSON line. Random
tokens (the data pipeline is not timed) through a real run's `build_state` and `train_step`, after warm-up steps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import torch
from omegaconf import DictConfig

from cart_sweeps.compose import compose_config, run_cli
from cart_sweeps.model import param_counts, train_flops_per_token
from cart_sweeps.train.loop import train_step
from cart_sweeps.train.metrics import mfu, peak_mem_mb
from cart_sweeps.train.setup import TrainState, build_state, compiles, configure_torch
from cart_sweeps.validate import validate

USAGE = """usage: python -m cart_sweeps.bench [OVERRIDE ...]

Times bench.steps training steps (after bench.warmup) of the composed model on this machine's device
and prints one JSON line. Overrides are Hydra's, e.g.:
  python -m cart_sweeps.bench scale=tiny model=dense bench.steps=20
  python -m cart_sweeps.bench model.d_model=1024 trainer.compile=false  # on a GPU, without compiling
"""


def random_steps(
    cfg: DictConfig, state: TrainState, device: torch.device, dtype: torch.dtype | None
) -> Callable[[int], None]:
    """`n` training steps on random tokens (the data pipeline is not timed), ended on the device: what both
    benchmarks time (bench_pace too)."""
    t = cfg.trainer
    shape = (t.micro_batch_size, t.seq_len + 1)

    def micro_batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(t.grad_accum):
            w = torch.randint(0, cfg.model.vocab_size, shape, device=device)
            yield w[:, :-1], w[:, 1:]

    def run(n: int) -> None:
        for _ in range(n):
            train_step(state.forward, state.optimizer, micro_batches(), t.grad_accum, dtype, t.grad_clip)
        if device.type == "cuda":  # the steps are timed, not their launch
            torch.cuda.synchronize()

    return run


def bench(overrides: list[str]) -> dict:
    cfg = compose_config(overrides)
    validate(cfg)
    t, b = cfg.trainer, cfg.bench
    device, dtype = configure_torch(cfg)
    run = random_steps(cfg, build_state(cfg, device), device, dtype)
    run(b.warmup)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run(b.steps)
    seconds = time.perf_counter() - start
    tokens = b.steps * t.grad_accum * t.micro_batch_size * t.seq_len
    counts = param_counts(cfg.model)
    tokens_per_s = tokens / seconds
    return {
        "model": cfg.model.name,
        "d_model": cfg.model.d_model,
        "tokens_per_s": round(tokens_per_s, 1),
        "ms_per_step": round(1000 * seconds / b.steps, 2),
        "mfu": mfu(tokens_per_s, train_flops_per_token(cfg.model, t.seq_len), device),
        "peak_mem_mb": peak_mem_mb(device),
        "params_stored": counts["stored"],
        "params_effective": counts["effective"],
        "seq_len": t.seq_len,
        "batch_size": t.micro_batch_size * t.grad_accum,
        "vocab_size": cfg.model.vocab_size,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype or torch.float32).removeprefix("torch."),
        "compile": compiles(cfg, device),
    }


def main(argv: list[str] | None = None) -> None:
    run_cli(lambda args: print(json.dumps(bench(args))), USAGE, argv)


if __name__ == "__main__":
    main()
