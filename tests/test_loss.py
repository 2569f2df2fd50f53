"""The training loss: bf16 logits are upcast to fp32 chunk by chunk, equal to torch's fp32 cross-entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cart_sweeps.train.loop import token_loss


def _logits(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 50, 300, generator=gen)).to(dtype).requires_grad_()
    return logits, torch.randint(0, 300, (2, 50), generator=gen)


def test_fp32_logits_take_torchs_cross_entropy_bit_for_bit():
    logits, targets = _logits(torch.float32)
    assert torch.equal(token_loss(logits, targets), F.cross_entropy(logits.flatten(0, 1), targets.flatten()))


def test_chunked_bf16_loss_and_gradient_equal_the_full_fp32_copy():
    logits, targets = _logits(torch.bfloat16)
    reference = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    (want,) = torch.autograd.grad(reference / 4, logits)
    loss = token_loss(logits, targets, chunk=17)  # chunks that do not divide the 100 tokens
    (got,) = torch.autograd.grad(loss / 4, logits)
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)  # bf16's own tolerance: both are fp32 gradients rounded to bf16
