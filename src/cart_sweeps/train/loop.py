"""One optimizer step (it never waits for the GPU: the loss and gradient norm stay device tensors) and one
evaluation pass, shared by the trainer, the variable-R evaluation and the bench."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cart_sweeps.data.loader import val_windows

# Tokens per chunk of the loss on low-precision logits: an fp32 chunk at V=32,000 is 125 MiB.
LOSS_CHUNK_TOKENS = 1024


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """bf16 autocast with fp32 parameters (the paper's precision), or nothing in fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean CE of low-precision logits, upcast to fp32 one chunk of tokens at a time, each chunk's gradient
    computed in the forward pass and kept in the logits' dtype: no fp32 copy of the whole logits ever exists."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
        n = logits.shape[0]
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        grad = torch.empty_like(logits) if logits.requires_grad else None
        for start in range(0, n, chunk):
            part = logits[start : start + chunk].float()
            target = targets[start : start + chunk]
            log_probs = torch.log_softmax(part, dim=-1)
            total += F.nll_loss(log_probs, target, reduction="sum")
            if grad is not None:
                probs = log_probs.exp_()
                probs[torch.arange(len(target), device=probs.device), target] -= 1
                grad[start : start + chunk] = probs / n
        ctx.save_for_backward(grad)
        return total / n

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return grad * grad_output.to(grad.dtype), None, None


def token_loss(logits: torch.Tensor, targets: torch.Tensor, chunk: int = LOSS_CHUNK_TOKENS) -> torch.Tensor:
    """Mean next-token CE (nats) over [B, T, V] logits in fp32: torch's own for fp32 logits (bit for bit the
    golden numbers), chunk by chunk for bf16 ones."""
    flat_logits, flat_targets = logits.flatten(0, 1), targets.flatten()
    if flat_logits.dtype == torch.float32:
        return F.cross_entropy(flat_logits, flat_targets)
    return _ChunkedCrossEntropy.apply(flat_logits, flat_targets, chunk)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    n_micro: int,
    amp_dtype: torch.dtype | None,
    grad_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulate gradients over the micro-batches, clip, step; (mean loss, grad norm), left on the device."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for inputs, targets in micro_batches:
        with autocast(inputs.device, amp_dtype):
            logits = model(inputs)
        loss = token_loss(logits, targets) / n_micro
        loss.backward()
        total += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, grad_norm


@torch.no_grad()
def evaluate_windows(model: nn.Module, windows: torch.Tensor, batch_size: int, n_loops: int | None = None) -> float:
    """Mean over windows of each window's mean next-token CE (nats), in fp32 outside autocast: PPL = exp(this), as
    in the paper. Taken over [tokens, V] rows (4.5x faster on a CPU than [B, V, T], equal to rounding)."""
    was_training = model.training
    model.eval()
    per_window = []
    for batch in windows.split(batch_size):
        logits = model(batch[:, :-1], n_loops=n_loops) if n_loops else model(batch[:, :-1])
        targets = batch[:, 1:]
        ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
        per_window.append(ce.view_as(targets).mean(dim=1))
    model.train(was_training)
    return torch.cat(per_window).mean().item()


class Diverged(RuntimeError):
    """The model's loss stopped being finite (in training, or as an evaluation's perplexity): a result."""


_MAX_EXP = math.log(float.fromhex("0x1.fffffffffffffp+1023"))  # the largest CE whose exp is a float


def eval_metrics(mean_ce: float, bytes_per_token: float) -> dict[str, float]:
    """CE (nats/token), perplexity and bits per byte from a mean CE: the per-set kinds of cart_sweeps.metric."""
    ppl = math.exp(mean_ce) if mean_ce <= _MAX_EXP else math.inf  # math.exp raises past a float's range
    return {"ce": mean_ce, "ppl": ppl, "bpb": mean_ce / math.log(2) / bytes_per_token}


def raise_if_diverged(metrics: dict[str, float], at: str) -> None:
    """An evaluation whose perplexity is not finite is the model's divergence, not an error to retry."""
    bad = next((k for k, v in metrics.items() if k.startswith("ppl_") and not math.isfinite(v)), None)
    if bad is not None:
        ce = metrics["ce_" + bad.removeprefix("ppl_")]
        raise Diverged(f"{bad} is {metrics[bad]} (mean CE {ce:.4g}) {at}; lower trainer.lr")


def evaluate_sets(model: nn.Module, data: Any, t: Any, device: torch.device, n_loops: int | None = None) -> dict:
    """`ce_<set>`, `ppl_<set>`, `bpb_<set>` on the first `t.eval_windows` windows of each validation set."""
    out: dict[str, float] = {}
    for name, tokens in data.val.items():
        windows = val_windows(tokens, t.eval_windows, t.seq_len).to(device)
        mean_ce = evaluate_windows(model, windows, t.eval_batch_size, n_loops=n_loops)
        out.update({f"{key}_{name}": value for key, value in eval_metrics(mean_ce, data.bytes_per_token[name]).items()})
    return out
