"""One optimizer step and one evaluation pass: shared by the trainer and the bench command."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """bf16 autocast with fp32 parameters (the paper's precision), or nothing in fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    n_micro: int,
    amp_dtype: torch.dtype | None,
    grad_clip: float,
) -> tuple[float, float]:
    """Accumulate gradients over the micro-batches, clip, step. Returns (mean loss, grad norm).

    The caller checks the loss for finiteness; the optimizer has stepped either way.
    """
    total = torch.zeros((), device=next(model.parameters()).device)
    for inputs, targets in micro_batches:
        with autocast(inputs.device, amp_dtype):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) / n_micro
        loss.backward()
        total += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total.item(), grad_norm.item()


@torch.no_grad()
def evaluate_windows(model: nn.Module, windows: torch.Tensor, batch_size: int, n_loops: int | None = None) -> float:
    """Mean over windows of each window's mean next-token CE (nats), in fp32 outside autocast.

    PPL = exp(this value), as in the paper (a mean of per-window means, not a token-weighted mean).
    """
    was_training = model.training
    model.eval()
    per_window = []
    for batch in windows.split(batch_size):
        logits = model(batch[:, :-1], n_loops=n_loops) if n_loops else model(batch[:, :-1])
        ce = F.cross_entropy(logits.float().transpose(1, 2), batch[:, 1:], reduction="none")
        per_window.append(ce.mean(dim=1))
    model.train(was_training)
    return torch.cat(per_window).mean().item()


def eval_metrics(mean_ce: float, bytes_per_token: float) -> dict[str, float]:
    """CE (nats/token), perplexity and bits per byte from a mean CE."""
    return {"ce": mean_ce, "ppl": math.exp(mean_ce), "bpb": mean_ce / math.log(2) / bytes_per_token}
