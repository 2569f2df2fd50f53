"""The study's findings as data (findings.json) and in words (the closing paragraph), read off the tables.

Each function named by a section of findings.json (stage1, parity, ...) is a table's findings hook
(analysis/registry.py), which collects them in the registry's order."""

from __future__ import annotations

from typing import Any, cast

import pandas as pd

from cart_sweeps.metric import metric as metric_record
from cart_sweeps.metric import require
from cart_sweeps.rules.decide import best

from .decisions import NO_SPREAD, SHORT, SIDES, label, plain, runs, seeds_text, where, worse_by
from .screen import shortest_screen
from .stages import ABLATIONS, CONFIRM, PARITY, SCREEN, VARIABLE_R
from .stats import spearman

Findings = dict[str, Any]


def _by_width(table: pd.DataFrame, column: str) -> dict[str, Any]:
    """{width as a string: value of column}, the JSON shape for per-width results."""
    return {str(plain(d)): plain(v) for d, v in zip(table["d"], table[column], strict=True)}


def stage1(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """Best config per width, R benefit, the P-ordering check and the variance shares."""
    out: Findings = {}
    if "stage1_best" in tables:
        out["best_per_width"] = {
            str(plain(r["d"])): {"R": plain(r["R"]), "P": plain(r["P"]), "metric": plain(r[metric])}
            for _, r in tables["stage1_best"].iterrows()
        }
    if "stage1_r_benefit" in tables:
        out["r_benefit_pct"] = _by_width(tables["stage1_r_benefit"], "change_pct")
    if "stage1_p_ordering" in tables:  # holds: yes / no where decided over the seeds, else why not
        order = tables["stage1_p_ordering"]
        marks = set(order["holds"])
        out["p_ordering_holds"] = False if "no" in marks else (True if marks == {"yes"} else None)
        out["p_ranking"] = max(order["expected"], key=lambda chain: chain.count(">"))
        out["p_ordering_breaks"] = [
            {"d": plain(r["d"]), "R": plain(r["R"]), "ranking": r["ranking"]}
            for _, r in order[order["holds"] == "no"].iterrows()
        ]
        out["p_ordering_undecided"] = int((~order["holds"].isin(["yes", "no"])).sum())
    if "stage1_variance" in tables:
        shares = tables["stage1_variance"].set_index("d")[["share_P", "share_R"]]
        shares.columns = ["P", "R"]
        out["variance_share"] = {k: plain(v) for k, v in shares.loc["pooled"].items()}
        out["variance_share_per_width"] = {
            d: {k: plain(v) for k, v in row.items()} for d, row in shares.drop("pooled").iterrows()
        }
    return out


def stage2(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """The best R per width over seeds."""
    return {"best_R_per_width": _by_width(tables["stage2_best"], "R")} if "stage2_best" in tables else {}


def reversal(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """Where Stage 2 reverses or confirms the Stage-1 pick of R over its seeds (decided), where it does
    neither (undecided), the p-values, and the rank agreement."""
    out: Findings = {}
    if "reversal" in tables:
        rev = tables["reversal"]
        for key, mark in (("reversed_widths", "yes"), ("confirmed_widths", "no")):
            out[key] = [plain(d) for d in rev.loc[rev["reversed"] == mark, "d"]]
        out["undecided_widths"] = [plain(d) for d in rev.loc[~rev["reversed"].isin(["yes", "no"]), "d"]]
        out.update({k: _by_width(rev, k) for k in ("stage1_R", "stage2_R", "p_value")})
    if "reversal_cells" in tables:
        cells = tables["reversal_cells"]
        out["spearman"] = plain(spearman(cells[f"stage1_{metric}"], cells[f"stage2_{metric}"]))
        out["spearman_cells"] = len(cells)
    return out


def parity(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """Gap per validation set at stored and effective parity (where several widths have parity runs,
    the widest)."""
    if "parity" not in tables:
        return {}
    table = tables["parity"].sort_values(["d", "L"])
    return {
        name: {
            "d": plain(g["d"].iloc[0]),
            "n_layers": plain(g["L"].iloc[0]),
            "gap_pct": dict(zip(g["metric"], map(plain, g["gap_pct"]), strict=True)),
        }
        for (name, _), g in table.groupby(["parity", "d"], sort=False)
    }


def ablations(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """Delta % per variant and set, and the verdict over the seed noise (hurts, helps, or undecided)."""
    if "ablations" not in tables:
        return {}
    return {
        variant: {
            "delta_pct": dict(zip(g["metric"], map(plain, g["delta_pct"]), strict=True)),
            "verdict": dict(zip(g["metric"], g["verdict"], strict=True)),
        }
        for variant, g in tables["ablations"].groupby("variant")
    }


def rho(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """The range of final rho, beside the range weight decay alone predicts."""
    if "rho" not in tables:
        return {}
    table = tables["rho"]
    return {
        "final_range": [plain(table["rho_min"].min()), plain(table["rho_max"].max())],
        "wd_only_range": [plain(table["rho_wd_only"].min()), plain(table["rho_wd_only"].max())],
    }


def _best_r(g: pd.DataFrame, column: str) -> tuple[Any, list[Any]]:
    """(the best inference R by the study's one rule, None where several R tie exactly; the tied R, or [])."""
    found = best({r: [v] for r, v in zip(g["R"], g[column], strict=True) if pd.notna(v)}, require(column))
    if found is None:
        return None, []
    tied = sorted([found.choice, *found.tied]) if found.tied else []
    return (None if tied else plain(found.choice)), [plain(r) for r in tied]


def _by_inference_r(table: pd.DataFrame, sets: list[str]) -> Findings:
    """Per width: the trained R, the best inference R per set (None where R tie exactly: `tied_R` names them), and
    whether the trained R is (or ties for) that best."""
    out: Findings = {}
    for d, g in table.groupby("d"):
        trained = plain(g["trained_R"].dropna().iloc[0]) if g["trained_R"].notna().any() else None
        picks = {s: _best_r(g, s) for s in sets if s in g}
        out[str(plain(d))] = {
            "trained_R": trained,
            "best_R": {s: r for s, (r, _) in picks.items()},
            "tied_R": {s: tied for s, (_, tied) in picks.items() if tied},
            "trained_is_best": {s: r == trained or trained in tied for s, (r, tied) in picks.items()},
            "every_R_tied": {s: len(tied) == g["R"].nunique() for s, (_, tied) in picks.items() if tied},
        }
    return out


def variable_r(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """Per width: the trained R, the best inference R per set, and whether the trained R is that best."""
    if "variable_r" not in tables:
        return {}
    table = tables["variable_r"]
    return _by_inference_r(table, [c for c in table.columns if c.startswith("ppl_")])


def variable_r_bench(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """Per width: the best inference R for each lm-eval task metric (in the score's own direction), and whether
    it is the trained R; a score every R ties on is said tied, never a pick."""
    if "variable_r_bench" not in tables:
        return {}
    table = tables["variable_r_bench"]
    return _by_inference_r(table, [c for c in table.columns if c.startswith("bench_") and metric_record(c)])


def screen(tables: dict[str, pd.DataFrame], metric: str) -> Findings:
    """How early each stage's ranking settles, how Stage 1's ranking carries to Stage 2, and what the input
    cannot show (a results CSV of final numbers has no ranking along the way)."""
    out: Findings = {}
    if "screen_agreement" in tables:
        table = tables["screen_agreement"]
        out["agreement"] = {
            str(stage): {
                str(plain(d)): [
                    {k: plain(r[k]) for k in ("step", "n", "kendall_tau", "spearman", "top1_agrees")}
                    for _, r in rows.sort_values("step").iterrows()
                ]
                for d, rows in by_stage.groupby("d")
            }
            for stage, by_stage in table.groupby("stage")
        }
        shortest = shortest_screen(table)
        for widths in shortest.values():  # a screen settles for a stage when it has settled at every width
            steps = {k: [w[k] for w in widths.values()] for k in ("top1_step", "full_order_step")}
            widths["all_widths"] = {k: None if None in v else max(cast(list[float], v)) for k, v in steps.items()}
        out["shortest"] = shortest
    if "screen_transfer" in tables:
        out["stage1_to_stage2"] = {
            str(plain(d)): {
                r["stage2_point"]: {
                    k: plain(r[k]) for k in ("stage2_step", "n", "kendall_tau", "spearman", "top1_agrees")
                }
                for _, r in rows.iterrows()
            }
            for d, rows in tables["screen_transfer"].groupby("d")
        }
    if "screen_promotion" in tables:
        out["promotion"] = {
            str(plain(r["d"])): {k: plain(v) for k, v in r.items() if k != "d" and not pd.isna(v)}
            for _, r in tables["screen_promotion"].iterrows()
        }
    if out:
        out["limits"] = _screen_limits(tables)
    return out


def _screen_limits(tables: dict[str, pd.DataFrame]) -> list[str]:
    limits = []
    if "screen_agreement" not in tables:
        limits.append(
            "The input holds each run's final evaluation only: neither the agreement of earlier steps' "
            "rankings with the final one nor the shortest reliable screen can be measured."
        )
    if "screen_transfer" in tables and (tables["screen_transfer"]["stage2_point"] != "matching").all():
        limits.append(
            "Stage 2 has no evaluation at or before Stage 1's last step: Stage 1's final ranking is compared "
            "with Stage 2's end only, not with Stage 2 at the matching step."
        )
    shared = tables["screen_transfer"]["n"].max() if "screen_transfer" in tables else None
    if shared is not None and shared < 2:
        limits.append("Stage 1 and Stage 2 share fewer than two configurations per width: nothing to rank.")
    elif shared is not None and shared < 3:
        limits.append("Fewer than three configurations per width in both stages: only the top-1 pick is compared.")
    return limits


Said = tuple[str, str]  # (what a finding is of: "Stage 2", or ACROSS for one drawn across stages; its sentence)
ACROSS, NOTES = "Across stages", "Notes"
MEASURED_WITH = "measured_with"  # findings.json: stage -> its ranking metric's unseen noise (analysis.throughput)


def said(f: Findings, stages: dict[str, str]) -> list[Said]:
    """Every finding in words with the stage it is of (`stages`: role -> the stage playing it), in the order of
    the paper; every claim as its record in f["decisions"] says, so an undecided one reads as undecided."""
    metric = f["metric"]
    parts: list[Said] = []
    claims: dict[str, list[Findings]] = {}
    for record in f.get("decisions", []):
        claims.setdefault(record["claim"], []).append(record)

    def of(role: str) -> str:
        return f"Stage {stages.get(role, role)}"

    beside = {f"Stage {s}": line for s, line in f.get(MEASURED_WITH, {}).items()}

    def add(at: str, sentences_: list[str], reads_metric: bool = True) -> None:
        """`sentences_` of `at`; where they read the ranking metric and it was measured beside other runs (a
        throughput: analysis.throughput), each says so."""
        told = beside.get(at) if reads_metric else None
        parts.extend((at, f"{s.removesuffix('.')}; {told}." if told else s) for s in sentences_)

    s1 = f.get("stage1", {})
    add(of(SCREEN), _best_words([c for c in claims.get("best_R", []) if c["role"] == SCREEN]))
    if "p_ordering_holds" in s1:
        marks = {True: "holds at every R and width", False: f"breaks at {len(s1['p_ordering_breaks'])} (d, R) cell(s)"}
        said_ = marks.get(s1["p_ordering_holds"], f"is undecided at {s1['p_ordering_undecided']} (d, R) cell(s)")
        flat = any(c["method"] == "none" for c in claims.get("p_ordering", []))
        add(of(SCREEN), [f"The P ranking {s1['p_ranking']} {said_}" + (" (no seed spread)." if flat else ".")])
    if "variance_share" in s1:
        share = s1["variance_share"]
        explains = f"P explains {share['P']:.0%} and R {share['R']:.0%} of the variance of log-{metric}"
        add(of(SCREEN), [f"Pooled over widths, {explains}."])
    if "r_benefit_pct" in s1:
        gains = ", ".join(f"d={d} {v:+.1f}%" for d, v in s1["r_benefit_pct"].items())
        add(of(SCREEN), [f"From the smallest to the largest R at the best P, {metric} changes by {gains}."])
    add(of(CONFIRM), _best_words([c for c in claims.get("best_R", []) if c["role"] == CONFIRM]))
    add(of(CONFIRM), [_reversal_said(c) for c in claims.get("reversal", [])])
    rev = f.get("reversal", {})
    if rev.get("spearman") is not None:
        add(
            of(CONFIRM),
            [f"Spearman between the stages over {rev['spearman_cells']} shared cells: {rev['spearman']:.3f}."],
        )
    add(of(PARITY), _parity_words(f, claims.get("parity", [])), reads_metric=False)  # per validation set
    add(of(ABLATIONS), _ablation_words(f, claims.get("ablation", [])))
    add(of(VARIABLE_R), [_inference_words(c, metric) for c in claims.get("trained_R_best", [])])
    for d, v in f.get("variable_r_bench", {}).items():
        bench = [f"On the benchmarks at d={d} (trained R={v['trained_R']}): {_bench_words(v)}."]
        add(of(VARIABLE_R), bench, reads_metric=False)
    if "rho" in f:
        lo, hi = f["rho"]["final_range"]
        wlo, whi = f["rho"]["wd_only_range"]
        add(ACROSS, [f"Final rho spans {lo:.3f}-{hi:.3f}; weight decay alone predicts {wlo:.3f}-{whi:.3f}."])
    for at, sentence in _screen_words(f.get("screen", {}), of(CONFIRM)):  # rankings by the metric, over steps
        add(at, [sentence])
    for stage, records in f.get("stage_decisions", {}).items():
        add(f"Stage {stage}", [record["said"] for record in records], reads_metric=False)  # each says its own
    return parts


def grouped(f: Findings, notes: list[str], stages: dict[str, str]) -> dict[str, list[str]]:
    """The findings by what they are of (a stage, in the order of its first finding; ACROSS), the notes last."""
    by: dict[str, list[str]] = {}
    for at, sentence in [*said(f, stages), *((NOTES, note) for note in notes)]:
        by.setdefault(at, []).append(sentence)
    return by


def words(f: Findings, notes: list[str], stages: dict[str, str]) -> str:
    """The findings as one paragraph (what the command prints), in report.md's order."""
    return " ".join(sentence for found in grouped(f, notes, stages).values() for sentence in found)


def listed(f: Findings, notes: list[str], stages: dict[str, str]) -> str:
    """The findings as report.md lists them: a heading per stage, one bullet per finding under it."""
    by = grouped(f, notes, stages)
    return "\n".join(f"### {at}\n\n" + "".join(f"- {s}\n" for s in found) for at, found in by.items())


def _parity_words(f: Findings, claims: list[Findings]) -> list[str]:
    """Per dense depth: the gap on each set, and which side is better where decided."""
    by = {(c["cell"]["parity"], c["cell"]["metric"]): c for c in claims}
    parts = []
    for name, p in f.get("parity", {}).items():
        gaps = ", ".join(
            f"{m} {g:+.1f}% " + _verdict(by[(name, m)], f"{SIDES.get(by[(name, m)]['choice'])} better")
            for m, g in p["gap_pct"].items()
            if g is not None
        )
        parts.append(f"Dense with {p['n_layers']} layers ({name} parity, d={p['d']}) against CART: {gaps}.")
    return parts


def _ablation_words(f: Findings, claims: list[Findings]) -> list[str]:
    """Each switch on the ranking metric: its delta and whether it hurts, helps, or is undecided."""
    if "ablations" not in f:
        return []
    metric = f["metric"]
    said = [
        f"{c['cell']['variant']} {f['ablations'][c['cell']['variant']]['delta_pct'][metric]:+.1f}% "
        + _verdict(c, str(c["choice"]))
        for c in claims
        if c["cell"]["metric"] == metric
    ]
    return [f"Ablations on {metric}: {'; '.join(said) or 'none'}."]


def _bench_words(v: Findings) -> str:
    """Each score's best inference R at one width, a tie said as a tie: 'cart_lastword_acc best at R=4;
    cart_nextpassage_acc tied at every R'."""
    said = []
    for s, r in v["best_R"].items():
        name, tied = s.removeprefix("bench_"), v["tied_R"].get(s, [])
        if v["every_R_tied"].get(s):
            said.append(f"{name} tied at every R")
        elif tied:
            said.append(f"{name} tied best at R={', '.join(map(str, tied))}")
        else:
            said.append(f"{name} best at R={r}")
    return "; ".join(said)


def _inference_words(claim: Findings, metric: str) -> str:
    """The best inference R at one width, and whether it is the trained R; an undecided one names no best."""
    trained, best = claim["cell"]["trained_R"], claim["choice"]
    if not claim["decided"]:
        return f"Varying inference R at d={claim['d']} (trained R={trained}): undecided for {metric}, {claim['why']}."
    said = "the trained R" if best == trained else f"not the trained R={trained}"
    return f"Varying inference R at d={claim['d']}: {metric} is best at R={best} ({said}); {_evidence(claim)}."


def _best_words(records: list[Findings]) -> list[str]:
    """A stage's best-R claims: the ones without seed spread in one sentence, each other one on its own."""
    flat = [r for r in records if r["method"] == "none" and r["noise"] is None]  # one seed per option
    return ([_no_spread(flat)] if flat else []) + [_best_said(r) for r in records if r not in flat]


def _screen_words(screen: Findings, confirm: str) -> list[Said]:
    """The screen's reliability in sentences: the shortest screen per stage (of that stage), the Stage 1 -> 2
    carry-over and the promotion audit (of the confirming stage, `confirm`), what the input cannot show (ACROSS)."""
    parts: list[Said] = []
    for stage, widths in screen.get("shortest", {}).items():
        every = widths["all_widths"]
        final = max(w["final_step"] for d, w in widths.items() if d != "all_widths")
        if every["full_order_step"] is not None:
            said = (
                f"from step {every['full_order_step']} of {final} on, every width's ranking matches its final one "
                "(the shortest screen that would have sufficed)"
            )
        elif every["top1_step"] is not None:
            said = (
                f"the top pick settles at step {every['top1_step']} of {final} at every width; the full ranking "
                "matches the final one only at the end"
            )
        else:
            said = f"no screen shorter than the full {final} steps gives the final ranking"
        parts.append((f"Stage {stage}", f"Stage {stage}: {said}."))
    for d, points in screen.get("stage1_to_stage2", {}).items():
        told = [
            f"{when} (step {p['stage2_step']}): top-1 {'kept' if p['top1_agrees'] else 'changed'}"
            + (f", tau {p['kendall_tau']:.2f}" if p["kendall_tau"] is not None else "")
            for when, p in points.items()
            if p["top1_agrees"] is not None  # fewer than two configurations in both stages: nothing to rank
        ]
        if told:
            parts.append((confirm, f"Stage 1's final ranking against Stage 2 at d={d}: {'; '.join(told)}."))
    promotion = [(confirm, sentence) for sentence in _promotion_words(screen.get("promotion", {}))]
    return parts + promotion + [(ACROSS, limit) for limit in screen.get("limits", [])]


def _promotion_words(promotion: Findings) -> list[str]:
    """The promotion audit in sentences: the rankings' pairwise agreement, and whether the cutoff missed a winner."""
    parts = []
    pooled = promotion.get("all", {})
    if pooled.get("agreement") is not None:
        parts.append(
            f"Stage 1's and Stage 2's rankings order {pooled['agreement']:.0%} of {pooled['pairs']} configuration "
            f"pairs alike (95% bootstrap interval {pooled['ci_low']:.0%} to {pooled['ci_high']:.0%})."
        )
    for d, r in promotion.items():
        if d == "all" or "cutoff_missed_winner" not in r:
            continue
        rank = f"screen rank {int(r['winner_screen_rank'])}" if "winner_screen_rank" in r else "not screened"
        missed, zoomed = r["cutoff_missed_winner"], r.get("zoomed")
        said = (
            ("missed it (a sentinel ran it)" if missed else "promoted it")
            if zoomed
            else ("would have missed it" if missed else "would have promoted it")
        )
        parts.append(f"d={d}: Stage 2's winner {r['winner']} ({rank}); the zoom rule {said}.")
    return parts


# Each claim in words, from its record in findings.json: a decided claim with its margin and p, an undecided one
# as undecided (the options the data cannot tell apart), never an undecided one as a fact.
def _seeds(record: Findings) -> str:
    """'3 seeds each' or '3/3/1 seeds (6/8/10)': each option's seeds, and the options where they differ."""
    n = list(record["seeds"].values())
    return seeds_text(n) + ("" if len(set(n)) == 1 else f" ({'/'.join(record['seeds'])})")


def _evidence(record: Findings) -> str:
    """The margin with its interval and the p: '1.9% [1.4, 2.4] worse than R=8, p=2e-05'."""
    m = record["margin"]
    worse = worse_by(m["pct"], m["ci_pct"], record["alpha"], record["p_value"])
    return f"{label(record['axis'], m['over'])} is {worse} with {_seeds(record)}"


def _best_said(record: Findings) -> str:
    """A best-of-k claim: decided with its margin over the runner-up, or the options it cannot tell apart."""
    place, choice = where(record["stage"], record["cell"]), label(record["axis"], record["choice"])
    if record["decided"] and record.get("equivalent"):  # equivalent within the margin: no one best
        return f"{place}: {record['why']}."
    if record["decided"]:
        left = f"; {runs(record['no_level'])} no {SHORT.get(record['axis'], record['axis'])} (left out)"
        return f"{place}: {choice} is best; {_evidence(record)}{left * bool(record['no_level'])}."
    return f"{place}: undecided, {record['why']}."


def _no_spread(records: list[Findings]) -> str:
    """Best-of-k claims a stage without seed spread makes, in one sentence: point picks, undecided."""
    picks = ", ".join(
        f"{where('', r['cell']).removeprefix('Stage , ')} {label(r['axis'], r['choice'])} "
        f"({r['means'][str(r['choice'])]:.4g})"
        for r in records
    )
    stage = records[0]["stage"]
    return f"Stage {stage} runs one seed per configuration ({NO_SPREAD}), so its picks are undecided: {picks}."


def _reversal_said(record: Findings) -> str:
    """Stage 1's pick at one width: reversed, confirmed, or neither, and why."""
    d = record["d"]
    if not record["decided"]:
        return f"d={d}: undecided, Stage 2 neither reverses nor confirms Stage 1's pick of R: {record['why']}."
    said = "reverses" if record["choice"] == "reversed" else "confirms"
    return f"d={d}: Stage 2 {said} Stage 1's pick ({record['why']}); {_evidence(record)}."


def _verdict(record: Findings, decided: str) -> str:
    """'hurts (p=0.001)' or 'undecided (no seed spread)' or 'undecided (p=0.4)'."""
    if record["decided"]:
        return f"{decided} (p={record['p_value']:.2g})"
    if record["method"] == "none":
        return f"undecided ({NO_SPREAD if record['noise'] is None else record['why']})"
    return f"undecided (p={record['p_value']:.2g})"
