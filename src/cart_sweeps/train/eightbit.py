"""Whether bitsandbytes' AdamW8bit (trainer.optimizer=adamw8bit, the author's optimizer) can run here.

Torch-free: the stage driver asks before launching, the run again when it builds its optimizer. On CUDA any
bitsandbytes will do; on a CPU only one with CPU kernels for its 8-bit optimizers, which 0.50.0 added
(bitsandbytes/backends/cpu/ops.py registers optimizer_update_8bit_blockwise; 0.49.2 has none).
"""

from __future__ import annotations

from importlib import metadata

CPU_KERNELS = (0, 50)
INSTALL = "pip install 'cart_sweeps[hub]'"


def _release(version: str) -> tuple[int, ...]:
    """(0, 50, 2) of '0.50.2' or '0.50.2.dev0'; stops at the first part that is not a number."""
    parts = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def adamw8bit_problem(cuda: bool, version: str | None = None) -> str | None:
    """Why adamw8bit cannot run on a CUDA GPU (`cuda`) or a CPU here, in one line; None where it can.
    `version`: bitsandbytes' version (default: the installed one's)."""
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
