"""Whether bitsandbytes' AdamW8bit (the author's optimizer) can run here, torch-free (the driver asks before
launching): on CUDA any release; on a CPU only one with CPU kernels for its 8-bit optimizers (0.50.0 added them).
"""

from __future__ import annotations

import itertools
from importlib import metadata

CPU_KERNELS = (0, 50)
INSTALL = "pip install 'cart_sweeps[hub]'"


def _release(version: str) -> tuple[int, ...]:
    """(0, 50, 2) of '0.50.2' or '0.50.2.dev0'; stops at the first part that is not a number."""
    return tuple(int(p) for p in itertools.takewhile(str.isdigit, version.split(".")))


def adamw8bit_problem(cuda: bool, version: str | None = None) -> str | None:
    """Why adamw8bit cannot run on a CUDA GPU (`cuda`) or a CPU here, in one line; None where it can."""
    if version is None:
        try:
            version = metadata.version("bitsandbytes")
        except metadata.PackageNotFoundError:
            return f"trainer.optimizer=adamw8bit needs bitsandbytes: {INSTALL}"
    if not cuda and _release(version) < CPU_KERNELS:
        return (
            f"trainer.optimizer=adamw8bit on a CPU needs bitsandbytes >= 0.50 (its CPU kernels; {version} is "
            f"installed): {INSTALL}, or trainer.optimizer=adamw"
        )
    return None
