"""The parts of the paper's study, by role (a stage file's `role:`): tables read runs by role, no stage by name.
A stage's role is what its newest launch recorded (stage.json), else its shipped namesake's, if not taken."""

from __future__ import annotations

from pathlib import Path

from cart_sweeps.options import StageRole
from cart_sweeps.roles import stage_roles
from cart_sweeps.stagerecord.runset import StageRecord

SCREEN, CONFIRM, PARITY, ABLATIONS, VARIABLE_R, BENCHMARKS = map(str, StageRole)  # the paper's, in its order


def shipped_roles() -> dict[str, str]:
    """Stage name -> role, as the shipped stage files claim them."""
    return {f.name: str(role) for role, f in stage_roles().items()}


def roles_of(root: Path | None, stages: list[str]) -> dict[str, str]:
    """Stage name -> role for `stages` (under `root`, where their records are); stages without one are absent."""
    recorded = {s: r for s in stages if root and (r := StageRecord.read(root / s)) is not None}
    out = {s: str(r.role) for s, r in recorded.items() if r.role}
    taken = set(out.values())
    for stage, role in shipped_roles().items():
        if stage in stages and stage not in recorded and role not in taken:
            out[stage] = role
    return out
