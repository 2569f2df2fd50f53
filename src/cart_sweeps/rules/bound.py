"""The floor: the least expected compute any alpha-correct procedure spends to decide one width (Garivier &
Kaufmann 2016, Theorem 1; Gaussian seed noise of known s.d., full-length runs only): the cheapest runs N_i with
1/N_a + 1/N_b <= d_b^2 / (2 sd^2 kl(alpha, 1 - alpha)) for the choice a and every other option b, d_b the
distance to the nearest truth where the answer about b changes. Derivation and figures: docs/ladder.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cart_sweeps.text import duration

if TYPE_CHECKING:
    from cart_sweeps.rules.decide import Option


def distance(gap: float, margin: float | None) -> float:
    """How far a true gap lies from a truth that changes the right answer: with a margin E either answer is
    right in (0, E), so the easier counts."""
    if margin is None or gap >= margin:
        return gap
    return max(gap, margin - abs(gap))


def floor(gaps: Sequence[float], sd: float, alpha: float, margin: float | None = None,
          costs: Sequence[float] | None = None) -> float:  # fmt: skip
    """The least expected compute (in `costs` per option's run; default runs) for true `gaps` behind the best (its
    own 0 first) at seed s.d. `sd`; inf where an exact tie has no margin."""
    costs = list(costs) if costs is not None else [1.0] * len(gaps)
    kl = (1 - 2 * alpha) * math.log((1 - alpha) / alpha)  # kl(alpha, 1 - alpha): the information to be wrong <= alpha
    need = [distance(g, margin) ** 2 / (2 * sd * sd * kl) for g in gaps[1:]]
    if not need:
        return 0.0
    if min(need) <= 0:
        return math.inf
    from scipy.optimize import minimize_scalar

    def total(inv_a: float) -> float:
        """Compute given 1/N_a: each other option then needs 1/N_b = need_b - 1/N_a."""
        return costs[0] / inv_a + sum(c / (n - inv_a) for c, n in zip(costs[1:], need, strict=True))

    top = min(need)
    found = minimize_scalar(total, bounds=(top * 1e-9, top * (1 - 1e-9)), method="bounded", options={"xatol": 1e-12})
    return float(found.fun)


def floor_line(opts: Sequence[Option], sd: float, alpha: float, margin: float | None, costs: Sequence[float]) -> str:
    """`plan`'s floor line at the observed gaps and noise (options best first; `costs`: a run's hours, plan's unit)."""
    need = floor([o.score_mean - opts[0].score_mean for o in opts], sd, alpha, margin, costs)
    if not math.isfinite(need):
        return "floor: none finite (an observed tie and no stage.equivalence)"
    return f"floor {duration(need)} of run time at the observed gaps and noise (rules/bound.py: any alpha-correct rule)"
