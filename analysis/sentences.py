"""Each claim in words, from its record in findings.json: a decided claim with its margin and p, an
undecided one as undecided (the options the data cannot tell apart), never an undecided one as a fact."""

from __future__ import annotations

from typing import Any

from .decisions import NO_SPREAD, SHORT, label, runs, seeds_text, where, worse_by

Record = dict[str, Any]  # a Decision as findings.json holds it (Decision.as_json)
SIDES = {"cart": "CART", "dense": "dense"}  # a parity claim's options, as written


def seeds(record: Record) -> str:
    """'3 seeds each' or '3/3/1 seeds (6/8/10)': each option's seeds, and the options where they differ."""
    n = list(record["seeds"].values())
    return seeds_text(n) + ("" if len(set(n)) == 1 else f" ({'/'.join(record['seeds'])})")


def evidence(record: Record) -> str:
    """The margin with its interval and the p: '1.9% [1.4, 2.4] worse than R=8, p=2e-05'."""
    m = record["margin"]
    worse = worse_by(m["pct"], m["ci_pct"], record["alpha"], record["p_value"])
    return f"{label(record['axis'], m['over'])} is {worse} with {seeds(record)}"


def best(record: Record) -> str:
    """A best-of-k claim: decided with its margin over the runner-up, or the options it cannot tell apart."""
    place, choice = where(record["stage"], record["cell"]), label(record["axis"], record["choice"])
    if record["decided"]:
        left = f"; {runs(record['no_level'])} no {SHORT.get(record['axis'], record['axis'])} (left out)"
        return f"{place}: {choice} is best; {evidence(record)}{left * bool(record['no_level'])}."
    return f"{place}: undecided, {record['why']}."


def no_spread(records: list[Record]) -> str:
    """Best-of-k claims a stage without seed spread makes, in one sentence: point picks, undecided."""
    picks = ", ".join(
        f"{where('', r['cell']).removeprefix('Stage , ')} {label(r['axis'], r['choice'])} "
        f"({r['means'][str(r['choice'])]:.4g})"
        for r in records
    )
    stage = records[0]["stage"]
    return f"Stage {stage} runs one seed per configuration ({NO_SPREAD}), so its picks are undecided: {picks}."


def reversal(record: Record) -> str:
    """Stage 1's pick at one width: reversed, confirmed, or neither, and why."""
    d = record["d"]
    if not record["decided"]:
        return f"d={d}: undecided, Stage 2 neither reverses nor confirms Stage 1's pick of R: {record['why']}."
    said = "reverses" if record["choice"] == "reversed" else "confirms"
    return f"d={d}: Stage 2 {said} Stage 1's pick ({record['why']}); {evidence(record)}."


def verdict(record: Record, decided: str) -> str:
    """'hurts (p=0.001)' or 'undecided (no seed spread)' or 'undecided (p=0.4)'."""
    if record["decided"]:
        return f"{decided} (p={record['p_value']:.2g})"
    if record["method"] == "none":
        return f"undecided ({NO_SPREAD if record['noise'] is None else record['why']})"
    return f"undecided (p={record['p_value']:.2g})"
