"""The stages playing each part of the paper's study, from their `role:` in sweeps/: no stage is named here."""

from __future__ import annotations

from cart_sweeps.config import StageRole, stages_of

SCREEN, CONFIRM, PARITY, ABLATIONS, VARIABLE_R, BENCHMARKS = stages_of(
    StageRole.screen,
    StageRole.confirm,
    StageRole.parity,
    StageRole.ablations,
    StageRole.variable_r,
    StageRole.benchmarks,
)
