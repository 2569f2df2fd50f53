"""The analysis of a ladder stage (a stage whose runs vary trainer.steps over its rungs): its tables
`ladder_<s>_rungs`, `_agreement`, `_drift` and figure `ladder_<s>_curves`, as docs/ladder.md describes them.
The rungs are recomputed from the runs through the driver's own rule (cart_sweeps.rules.ladder_walk), with the
design the driver recorded in the stage folder (from a CSV, inferred: the default drift prior and --alpha).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from cart_sweeps.metric import require
from cart_sweeps.rules.axes import SEED, STEPS, D
from cart_sweeps.rules.decide import SEEDS
from cart_sweeps.rules.ladder_walk import DRIFT_PRIOR, RECORD_FILE, Design, Walk, gaps, measured_rate, name, walk

from .errors import AnalysisError
from .figures import metric_label, save, styles
from .load import Study
from .promotion import agreement

WIDTH = "d_model"
PREFIX = "ladder_"
KINDS = ("rungs", "agreement", "drift")


def stages(study: Study) -> list[str]:
    """The ladder stages: those whose runs vary trainer.steps."""
    return sorted(s for s, axes in study.axes.items() if STEPS in axes.columns and not axes.search)


def stage_of(table: str) -> str | None:
    """The stage a ladder table or figure is of (None: not a ladder's)."""
    if not table.startswith(PREFIX):
        return None
    return table.removeprefix(PREFIX).rsplit("_", 1)[0]


def _config_keys(study: Study, stage: str) -> list[str]:
    return [c for c in study.axes[stage].columns if c not in (D, SEED, STEPS)]


def _width(study: Study, stage: str) -> str:
    """The column of each run's width, the ladder's decision group: its grid's axis, else the width the run had
    (a width in the recipe, or the model's own), which every run records."""
    return D if D in study.axes[stage].columns else WIDTH


def _rows(study: Study, stage: str, metric: str) -> pd.DataFrame:
    final = study.final()
    rows = final[(final["stage"] == stage)].dropna(subset=[metric, STEPS])
    if rows.empty:
        raise AnalysisError(f"ladder stage {stage} has no completed runs with {metric}")
    return rows


def _cells(rows: pd.DataFrame, width: str, keys: list[str], metric: str) -> dict:
    """(steps, width, config) -> seed -> value: each run by its own horizon (the steps it trained)."""
    cells: dict = {}
    for _, row in rows.iterrows():
        config = tuple((k, row[k]) for k in keys)
        cells.setdefault((int(row[STEPS]), int(row[width]), config), {})[int(row[SEED])] = float(row[metric])
    return cells


def _recorded(study: Study, stage: str) -> dict | None:
    """The design the stage's driver recorded for its newest ladder (RECORD_FILE in the stage folder)."""
    path = Path(study.source) / stage / RECORD_FILE
    return json.loads(path.read_text())["design"] if path.is_file() else None


def _design(shown: dict | None, rungs: list[int], data: dict, metric: str, alpha: float) -> Design:
    """The ladder as the stage ran it: the design its driver recorded, else, from a CSV, inferred: the seeds every
    cell has as the grid's, as many at most as any cell has, the default drift prior and `alpha`."""
    if shown is not None:
        seeds = tuple(shown["seeds"])
        return Design(tuple(shown["rungs"]), seeds, shown["grid_seeds"], len(seeds), require(metric), shown["prior"],
                      shown["alpha"], equivalence=shown.get("equivalence"))  # fmt: skip
    cells = [set(v) for v in data.values()]
    grid = sorted(set.intersection(*cells), key=lambda s: (s not in SEEDS, s))
    order = [*grid, *(s for s in SEEDS if s not in grid)]
    return Design(tuple(rungs), tuple(order), len(grid), max(map(len, cells)), require(metric), DRIFT_PRIOR, alpha)


def _walked(
    study: Study, stage: str, metric: str, alpha: float, least: int = 2
) -> tuple[list[int], dict, Walk, dict, Design]:
    """The ladder recomputed on the runs: the rungs' steps (the runs' horizons where the record has none for their
    scale), (rung, width, config) -> seed -> value, the walk, the runs at no rung of it (an earlier ladder's), and
    its design (rungs in paper steps: the record's, else a CSV's).
    `least`: the horizons the table needs (the rungs table: one, where stage.equivalence ended at the first)."""
    cells = _cells(_rows(study, stage, metric), _width(study, stage), _config_keys(study, stage), metric)
    shown, ran = _recorded(study, stage), {h for h, _, _ in cells}
    at_scales = (shown or {}).get("steps") or {}  # scale -> the steps of each rung: the scale these runs are at
    fits = [list(steps) for steps in at_scales.values() if ran & set(steps)]
    rungs = max(fits, key=lambda steps: len(ran & set(steps)), default=None) or sorted(ran)
    data = {(rungs.index(h), d, c): v for (h, d, c), v in cells.items() if h in rungs}
    if len(measured := sorted({rungs[k] for k, _, _ in data})) < least:
        raise AnalysisError(f"ladder stage {stage} has runs at one horizon of its ladder only ({measured} steps)")
    groups: dict = {}
    for _, d, config in (key for key in data if key[0] == 0):
        groups.setdefault(d, []).append(config)
    off = {key: v for key, v in cells.items() if key[0] not in rungs}
    design = _design(shown, rungs, data, metric, alpha)
    return rungs, data, walk(design, groups, data), off, design


def rungs_table(study: Study, stage: str, metric: str, alpha: float) -> pd.DataFrame:
    """Each configuration at each rung with what the ladder did there and why, read by the steps its runs trained:
    a rung's runs carry the decision made at that rung's horizon; a configuration this ladder stopped earlier, or a
    run at no rung of it (an earlier ladder's), is `not in this ladder`."""
    rungs, data, state, off, _ = _walked(study, stage, metric, alpha, least=1)
    said = {(c.rung, c.group, c.config): c for c in state.calls}
    stopped = {(c.group, c.config): c for c in state.calls if c.action != "promoted"}
    out = []
    for (k, d, config), seeds in sorted(data.items(), key=lambda item: (item[0][0], str(item[0][1]))):
        call, ended = said.get((k, d, config)), stopped.get((d, config))
        if call is None and ended is not None and ended.rung < k:
            action, reason = OUTSIDE, f"an earlier ladder's run: this one stopped it at rung {ended.rung + 1}"
        else:
            action, reason = (call.action, call.reason) if call else ("pending", "")
        out.append(_row(k + 1, rungs[k], d, config, seeds, metric, action, reason))
    for (h, d, config), seeds in off.items():
        reason = f"at {h} steps, no rung of this ladder ({'/'.join(map(str, rungs))} steps): an earlier ladder's run"
        out.append(_row(pd.NA, h, d, config, seeds, metric, OUTSIDE, reason))
    table = pd.DataFrame(out).astype({"rung": "Int64"})
    sign = require(metric).sign
    inside = table[table["action"] != OUTSIDE]
    table["rank"] = inside.groupby(["rung", "d"])[metric].rank(method="min", ascending=sign > 0).astype("Int64")
    return table.sort_values(["rung", "steps", "d", "rank"], kind="stable").reset_index(drop=True)


OUTSIDE = "not in this ladder"


def _row(rung: object, steps: int, d: int, config: tuple, seeds: dict, metric: str, action: str, reason: str) -> dict:
    return {"rung": rung, "steps": steps, "d": d, "config": name(config), metric: float(np.mean(list(seeds.values()))),
            "seeds": len(seeds), "action": action, "reason": reason}  # fmt: skip


def agreement_table(study: Study, stage: str, metric: str, alpha: float) -> pd.DataFrame:
    rungs, data, _, _, _ = _walked(study, stage, metric, alpha)
    sign = require(metric).sign

    def at(k: int) -> dict[tuple, np.ndarray]:
        """(width, *configuration) -> its values at rung k, oriented so that lower ranks first."""
        return {(d, *[v for _, v in c]): sign * np.array(list(s.values())) for (r, d, c), s in data.items() if r == k}

    rng = np.random.default_rng(0)  # the same interval each time
    last = max(k for k, _, _ in data)  # the longest rung run so far
    out = []
    for k in range(last):
        pairs, share, low, high = agreement(at(k), at(last), rng)
        out.append({"rung": k + 1, "steps": rungs[k], "final_steps": rungs[last], "pairs": pairs, "agreement": share,
                    "ci_low": low, "ci_high": high})  # fmt: skip
    return pd.DataFrame(out)


def drift_table(study: Study, stage: str, metric: str, alpha: float) -> pd.DataFrame:
    """Each gap's change between consecutive rungs per ln(paper steps) (`from`, `to`: the rungs' paper steps), the
    unit of the driver's drift and of the prior it is checked against."""
    _, data, _, _, design = _walked(study, stage, metric, alpha)
    rungs = list(design.rungs)
    m = require(metric)
    score = {key: float(np.mean([m.scaled(v) for v in s.values()])) for key, s in data.items()}
    widths = sorted({d for (_, d, _) in data}, key=str)
    members = [{d: [c for (r, g, c) in data if r == k and g == d] for d in widths} for k in range(len(rungs))]
    found = gaps(rungs, members, lambda *key: score[key])
    rates = [g.closed for g in found]
    out: list[dict] = [{"from": rungs[g.rung], "to": rungs[g.rung + 1], "d": g.group, "config": name(g.config),
                        "against": name(g.against), "gap_from": round(g.before, 6), "gap_to": round(g.after, 6),
                        "closed_per_ln_h": round(g.closed, 6)} for g in found]  # fmt: skip
    if rates:
        measured = measured_rate(rates, [0.0] * len(rates))  # the raw changes, noise and all: an upper view
        rms = math.sqrt(sum(r * r for r in rates) / len(rates))
        low, high = measured.interval or (0.0, 0.0)
        where = "within" if low <= DRIFT_PRIOR <= high else ("below" if DRIFT_PRIOR < low else "above")
        out.append({"from": rungs[0], "to": rungs[-1], "d": "all", "config": "root mean square",
                    "closed_per_ln_h": round(rms, 6), "ci_low": round(low, 6), "ci_high": round(high, 6),
                    "prior": DRIFT_PRIOR, "prior_is": f"{where} the 90% interval"})  # fmt: skip
    if not out:
        raise AnalysisError(f"ladder stage {stage} has no configuration run at two rungs beside its best")
    return pd.DataFrame(out)


BUILDERS = {"rungs": rungs_table, "agreement": agreement_table, "drift": drift_table}


def table_jobs(study: Study, metric: str, alpha: float) -> dict[str, Callable[[], pd.DataFrame]]:
    """Every ladder table the study's stages could give, by name."""
    return {
        f"{PREFIX}{stage}_{kind}": partial(build, study, stage, metric, alpha)
        for stage in stages(study)
        for kind, build in BUILDERS.items()
    }


def curves(study: Study, stage: str, metric: str) -> Figure:
    rows = _rows(study, stage, metric)
    keys = _config_keys(study, stage)
    width = _width(study, stage)
    widths = sorted(rows[width].unique())
    fig = Figure(figsize=(3.6 * len(widths), 3.4))
    axes = fig.subplots(1, len(widths), squeeze=False)[0]
    labels = pd.Series([_label(keys, values) for values in rows[keys].itertuples(index=False)], rows.index)
    style = styles(labels)  # one style a configuration, across the widths' panels
    for ax, d in zip(axes, widths, strict=True):
        here = rows[rows[width] == d]
        for label, group in here.groupby(labels[here.index]):
            means = group.groupby(STEPS)[metric].mean()
            ax.plot(means.index, means.values, marker="o", label=label, **style[label])
        ax.set_xscale("log")
        horizons = sorted(here[STEPS].unique())
        ax.set_xticks(horizons, [f"{h:g}" for h in horizons], minor=False)
        ax.minorticks_off()  # the rungs alone, in plain numbers: a log axis's minor labels crowd a short span
        ax.set_xlabel("horizon (steps of the run)")
        ax.set_title(f"d = {d:g}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(metric_label(metric))
    fig.suptitle(f"ladder {stage}: each configuration against the horizon")
    return fig


def _label(keys: list[str], values: tuple) -> str:
    """A configuration as its legend names it: n_loops=2 warmup_steps=12 ('all' where the stage varies no more)."""
    shown = [f"{v:g}" if isinstance(v, float) else v for v in values]  # a ledger's 2.0 reads 2
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(keys, shown, strict=True)) or "all"


def figure_jobs(study: Study, metric: str) -> dict[str, Callable[[Path], list[Path]]]:
    return {f"{PREFIX}{stage}_curves": partial(save, partial(curves, study, stage, metric)) for stage in stages(study)}
