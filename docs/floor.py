"""The floor of "equivalent" at a seed budget (issue 46): a direct simulation of the final test at n seeds per
option, seed s.d. 0.5%, E = 1%, alpha 0.05. `python docs/floor.py [draws]` prints, per candidate set and n, the
share of widths decided with every other option worse or equivalent (one equivalent at least, none falsely) and
the false-claim rate, for: the shipped rule (rules/decide.settle: Holm over both claims of every pair, pooled
s.d.; checked against best_level itself to +-0.02), Holm and Bonferroni over pairs on each pair's smaller p
(not alpha-correct: their false rate on a three-way tie), and an oracle that no pairwise rule beats (the s.d.
known, each pair at the full alpha, no multiplicity)."""

import sys

import numpy as np
from scipy import stats

ALPHA, SD, E = 0.05, 0.005, 0.01
CASES = {  # true log gaps of the options the final test compares (the simulator's truths at 30,500 steps)
    "ties: the paper's R=6,8,10": [0, 0, 0.005],
    "ties: the zoom's cross": [0, 0, 0.005, 0.005, 0.012],
    "flat_r: the paper's R": [0, 0, 0],
    "flat_r: the zoom's cross": [0, 0, 0, 0.005, 0.012],
}


def holm(p: np.ndarray) -> np.ndarray:
    order = np.argsort(p, axis=1, kind="stable")
    m = p.shape[1]
    adjusted = np.minimum(1, np.maximum.accumulate((m - np.arange(m)) * np.take_along_axis(p, order, 1), axis=1))
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, 1)
    return out


def rates(gaps: list[float], n: int, draws: int, known: bool = False, seed: int = 0) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(seed)
    g, k = np.asarray(gaps), len(gaps)
    x = g[None, :, None] + SD * rng.normal(size=(draws, k, n))
    means = x.mean(2)
    df = np.inf if known else k * (n - 1)
    s = np.full(draws, SD) if known else np.sqrt(((x - means[..., None]) ** 2).sum((1, 2)) / df)
    choice = means.argmin(1)
    other = np.array([[j for j in range(k) if j != c] for c in choice])
    diff = np.take_along_axis(means, other, 1) - means[np.arange(draws), choice][:, None]
    se = (s * np.sqrt(2 / n))[:, None]
    dist = stats.norm if known else stats.t(df)
    worse = np.minimum(1, 2 * dist.sf(diff / se))
    within = np.maximum(dist.sf((diff + E) / se), dist.cdf((diff - E) / se))
    true = g[other] - g[choice][:, None]
    both = holm(np.concatenate([worse, within], 1))
    rules = {
        "shipped": (np.minimum(both[:, : k - 1], both[:, k - 1 :]), both[:, k - 1 :] < both[:, : k - 1]),
        "holm pairs": (holm(np.minimum(worse, within)), within < worse),
        "bonferroni pairs": (np.minimum(worse, within) * (k - 1), within < worse),
        "oracle": (np.minimum(worse, within), within < worse),
    }
    out = {}
    for label, (adjusted, said_within) in rules.items():
        said = adjusted <= ALPHA
        false = (said & ((~said_within & (true <= 1e-12)) | (said_within & (np.abs(true) >= E - 1e-12)))).any(1)
        out[label] = (float((said.all(1) & (said & said_within).any(1) & ~false).mean()), float(false.mean()))
    return out


if __name__ == "__main__":
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    for case, gaps in CASES.items():
        for n in (3, 4, 5, 6, 8, 10):
            got = rates(gaps, n, draws) | {"oracle (s.d. known)": rates(gaps, n, draws, known=True)["oracle"]}
            print(f"{case:28} n={n:2} " + "  ".join(f"{k} {eq:.2f} (false {f:.3f})" for k, (eq, f) in got.items()))
