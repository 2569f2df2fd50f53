"""The ladder and sequential seeds against the paper's fixed design and the floor, on studies with a known truth
(`python -m cart_sweeps.simulate`: the table; its model, which `plan` runs too: cart_sweeps.rules.simulation)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from cart_sweeps.rules.decide import ALPHA
from cart_sweeps.rules.simulation import SD, SEQUENTIAL, TRUTHS, Row, ladders, shipped, simulate


def table(rows: Sequence[Row]) -> str:
    head = (
        f"{'truth':11} {'design':15} {'right':>6} {'equivalent':>10} {'undecided':>9} {'false':>6} {'compute':>8} "
        f"{'compute/bound':>13}"
    )
    lines = [head, "-" * len(head)]

    def share(x: float, width: int) -> str:
        return f"{'-':>{width}}" if math.isnan(x) else f"{x:{width}.3f}"

    for r in rows:
        lines.append(
            f"{r.truth:11} {r.design:15} {share(r.right, 6)} {share(r.equivalent, 10)} {share(r.undecided, 9)} "
            f"{share(r.false, 6)} {r.compute:8.2f} {share(r.over_bound, 13)}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cart_sweeps.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=200, help="studies (of four widths) per truth")
    parser.add_argument("--sd", type=float, default=SD, help="seed s.d. of log-perplexity")
    parser.add_argument("--seed", type=int, default=0)
    rungs, first, most = shipped()  # sweeps/ladder.yaml's
    parser.add_argument("--first", type=int, default=first, help="the ladder's grid seeds per cell")
    parser.add_argument("--most", type=int, default=most, help="the ladder's stage.max_seeds")
    parser.add_argument("--rungs", type=int, nargs="+", default=list(rungs), help="the ladder's horizons")
    parser.add_argument("--decay", type=float, default=0.2, help="the branched ladder's wsd decay fraction")
    parser.add_argument("--equivalence", type=float, default=None, help="the relative margin (0.01: 1%%)")
    parser.add_argument("--truths", nargs="+", default=list(TRUTHS), choices=list(TRUTHS))
    args = parser.parse_args(argv)
    chosen = ladders(args.rungs, args.first, args.most, args.decay, args.equivalence)
    d = chosen["ladder"]
    print(
        f"{args.reps} studies x 4 widths per truth; seed s.d. {args.sd:.2%} of log-perplexity; alpha {ALPHA}; "
        f"ladder rungs {list(d.rungs)}, {d.first} seeds (at most {d.most}), prior drift {d.prior:.2%} per "
        f"ln-horizon; branched: decay fraction {args.decay}; seeds: {SEQUENTIAL[0]} per zoom candidate, up to "
        f"{SEQUENTIAL[1]}, alpha spent O'Brien-Fleming-like; equivalence margin "
        f"{'none' if args.equivalence is None else f'{args.equivalence:.2%}'}; compute: share of fixed (zoom)'s"
    )
    print(table(simulate(args.reps, args.sd, args.seed, chosen, args.truths, args.equivalence)))


if __name__ == "__main__":
    main()
