"""The floor: the least compute any alpha-correct procedure spends, on average, to decide one width
(Garivier & Kaufmann 2016, "Optimal best arm identification with fixed confidence", Theorem 1), for Gaussian
seed noise of known s.d. on the tested scale and full-length runs only.

Any procedure that answers wrongly at most alpha of the time, on every truth, must for every alternative
truth `lam` whose right answer differs collect sum_i N_i KL_i(mu, lam) >= kl(alpha, 1 - alpha) in expectation
(N_i: option i's runs). For Gaussians the nearest alternative that flips the answer about option b moves b and
the choice a to meet at the answer's edge, which costs d_b^2 / (2 sd^2 (1/N_a + 1/N_b)); so the floor is the
cheapest runs N (each run of option i costing `cost_i`) with

    1/N_a + 1/N_b <= d_b^2 / (2 sd^2 kl(alpha, 1 - alpha))   for every other option b.

`d_b` is the distance to the nearest truth where the answer about b changes: without a margin, b's gap to the
best (an exact tie: no finite floor); with an equivalence margin E, either answer ("b is worse", "b is within
E") is right where the gap lies in (0, E), so the easier one counts: max(gap, E - gap) (E - |gap| for gap <= 0;
gap at or past E: only "worse" is right). The floor counts full-length runs: cheaper horizons carry a bias
known only up to the ladder's drift allowance, so they cannot settle gaps smaller than it (docs/ladder.md).
Three options 1% apart at 0.5% noise and alpha 0.05: 7.7 runs; the paper's 0.6%/0.8% gaps: 17.6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cart_sweeps.rules.decide import Option


def kl_bernoulli(x: float, y: float) -> float:
    """kl(x, y) of two Bernoulli laws: the information any procedure must gather to be wrong at most x where a
    coin of y tells the two truths apart (kl(alpha, 1 - alpha))."""
    return x * math.log(x / y) + (1 - x) * math.log((1 - x) / (1 - y))


def distance(gap: float, margin: float | None) -> float:
    """How far an option's true gap behind the best lies from a truth that changes the right answer about it
    (see the module's docstring)."""
    if margin is None or gap >= margin:
        return gap
    return max(gap, margin - abs(gap))


def floor(gaps: Sequence[float], sd: float, alpha: float, margin: float | None = None,
          costs: Sequence[float] | None = None) -> float:  # fmt: skip
    """The least expected compute (in units of `costs`, one per option; 1 each: runs) that decides options whose
    true gaps behind the best are `gaps` (the best's own, 0, first) at seed s.d. `sd`; inf where an exact tie has
    no margin."""
    costs = list(costs) if costs is not None else [1.0] * len(gaps)
    need = [distance(g, margin) ** 2 / (2 * sd * sd * kl_bernoulli(alpha, 1 - alpha)) for g in gaps[1:]]
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
    """What `plan` says of the floor at the observed gaps and noise (options best first, `costs`: GPU-hours of
    one run of each)."""
    need = floor([o.score_mean - opts[0].score_mean for o in opts], sd, alpha, margin, costs)
    if not math.isfinite(need):
        return "floor: none finite (an observed tie and no stage.equivalence)"
    return f"floor {need:,.2f} GPU-hours at the observed gaps and noise (rules/bound.py: any alpha-correct rule)"
