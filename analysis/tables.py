"""One builder per table of the study. Each takes the final row of every run and the ranking metric and
returns a DataFrame, or raises AnalysisError naming what the input lacks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from cart_sweeps.metric import require as require_metric
from cart_sweeps.rules.decide import best_per

from .load import VARIANT_AXIS, AnalysisError, bench_sets, ppl_sets, rank_values, require
from .stages import ABLATIONS, BENCHMARKS, CONFIRM, PARITY, SCREEN, VARIABLE_R
from .stats import ordering, recipe_of, variance_shares, wd_only_rho

SHORT = {"d_model": "d", "n_prelude": "P", "n_loops": "R", "n_layers": "L"}
CONFIG = ["d_model", "n_prelude", "n_loops"]


def select(final: pd.DataFrame, roles: tuple[str, ...], model: str = "cart", base_only: bool = True) -> pd.DataFrame:
    """The completed runs of the stages playing `roles` (one model; the baseline variant unless asked otherwise),
    each run once: a run several of these stages share (one run id) is read as the first role's, in `roles`' order."""
    rows = final[final["role"].isin(roles)] if "role" in final else final.iloc[0:0]
    if "model" in rows:
        rows = rows[rows["model"] == model]
    rows = rows[rows["variant"] == "base"] if base_only else rows
    if len(roles) > 1 and "run_id" in rows:
        order = rows["role"].map({role: i for i, role in enumerate(roles)})
        rows = rows.loc[order.sort_values(kind="stable").index].drop_duplicates("run_id").sort_index()
    return rows


def rows_of(
    final: pd.DataFrame, roles: tuple[str, ...], table: str, model: str = "cart", base_only: bool = True
) -> pd.DataFrame:
    """`select`, refusing in one line when `table` would have no rows to work on."""
    rows = select(final, roles, model, base_only)
    if rows.empty:
        wanted = " or ".join(f"the {role} stage" for role in roles)
        raise AnalysisError(f"table {table!r} needs {model} runs of {wanted}; the input has none")
    return rows


def matching(rows: pd.DataFrame, config: pd.Series) -> pd.DataFrame:
    """The rows whose columns equal every value of `config` (e.g. one d, P, R)."""
    mask = np.logical_and.reduce([(rows[k] == v).fillna(False).to_numpy(bool) for k, v in config.items()])
    return rows[mask]


def stage1_cells(final: pd.DataFrame, metric: str, table: str = "stage1") -> pd.DataFrame:
    """Stage-1 metric per (d, P, R), averaged over seeds where a cell has several, with its seed count
    (`seeds`: a screen's replicates are means of several seeds beside one-seed cells)."""
    rows = rows_of(final, (SCREEN,), table)
    require(rows, [*CONFIG, metric], table)
    cells = rows.dropna(subset=[metric]).groupby(CONFIG)[metric].agg(["mean", "count"]).reset_index()
    return cells.rename(columns={**SHORT, "mean": metric, "count": "seeds"})


def best_cells(rows: pd.DataFrame, by: list[str], options: list[str], metric: str) -> pd.DataFrame:
    """Per `by` group (a width), the configuration of `options` with the best seed mean, by the study's one rule
    (rules.decide.best_per, as zoom reads it: exact ties to the smallest, named in `exact_tie`)."""
    rows = rows.dropna(subset=[metric])
    groups = zip(*(rows[k].tolist() for k in by), strict=True)
    configs = zip(*(rows[k].tolist() for k in options), strict=True)
    chosen = best_per(zip(groups, configs, rows[metric].astype(float).tolist(), strict=True), require_metric(metric))
    names = [SHORT.get(k, k) for k in [*by, *options]]
    return pd.DataFrame(
        [
            {**dict(zip(names, (*group, *top.choice), strict=True)), "exact_tie": _configs(options, top.tied)}
            for group, top in chosen.items()
        ],
        columns=[*names, "exact_tie"],
    )


def _configs(keys: list[str], configs: tuple[tuple, ...]) -> str:
    """Configurations as text: 'R=4 P=2, R=4 P=6' ('' for none)."""
    return ", ".join(" ".join(f"{SHORT.get(k, k)}={v}" for k, v in zip(keys, c, strict=True)) for c in configs)


def stage1_grid(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The full Stage-1 grid: per width, rows P, columns R; where the cells' seed counts differ (a screen's
    replicates beside one-seed cells), each R's seed counts beside it (`seeds R=<r>`)."""
    cells = stage1_cells(final, metric, "stage1_grid")
    grid = cells.pivot(index=["d", "P"], columns="R", values=metric)
    grid.columns = [f"R={r}" for r in grid.columns]
    if cells["seeds"].nunique() > 1:
        seeds = cells.pivot(index=["d", "P"], columns="R", values="seeds")
        for r in seeds.columns:
            grid.insert(grid.columns.get_loc(f"R={r}") + 1, f"seeds R={r}", seeds[r].astype("Int64"))
    return grid.reset_index()


def stage1_best(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The best (P, R) per width (best seed mean): what Stage 1 hands to Stage 2, with its seed count."""
    cells = stage1_cells(final, metric, "stage1_best")
    best = best_cells(rows_of(final, (SCREEN,), "stage1_best"), ["d_model"], ["n_loops", "n_prelude"], metric)
    return best.merge(cells, on=["d", "P", "R"])[["d", "P", "R", metric, "seeds", "exact_tie"]]


def stage1_r_benefit(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """What more loops buy at the best P: % change of the metric from the smallest to the largest R."""
    cells = stage1_cells(final, metric, "stage1_r_benefit")
    best = stage1_best(final, metric)[["d", "P"]]
    rows = []
    for (d, p), g in cells.merge(best, on=["d", "P"]).sort_values("R").groupby(["d", "P"]):
        low, high = g.iloc[0], g.iloc[-1]
        change = (high[metric] - low[metric]) / low[metric] * 100
        rows.append(
            {
                "d": d,
                "P": p,
                "R_min": low["R"],
                "R_max": high["R"],
                "at_R_min": low[metric],
                "at_R_max": high[metric],
                "change_pct": change,
            }
        )
    return pd.DataFrame(rows)


def _stage1_factorial(final: pd.DataFrame, metric: str, table: str) -> pd.DataFrame:
    """Stage-1 cells with `log`, the metric on its tested scale oriented so that lower is better (log-metric for a
    perplexity; cart_sweeps.metric), refused when P or R has a single level (nothing to compare)."""
    cells = stage1_cells(final, metric, table)
    for factor in ("P", "R"):
        if cells[factor].nunique() < 2:
            raise AnalysisError(f"table {table!r} needs at least 2 values of {factor} in stage 1")
    record = require_metric(metric)  # the analysis ranks only by metrics with a record (load.pick_metric)
    return cells.assign(log=[record.scaled(v) for v in cells[metric].astype(float)])


def p_reference(final: pd.DataFrame, metric: str) -> list:
    """The pooled ranking of P, best first: P's mean log-metric after removing each width's mean."""
    cells = _stage1_factorial(final, metric, "stage1_p_ordering")
    centred = cells["log"] - cells.groupby("d")["log"].transform("mean")
    pooled = centred.groupby(cells["P"]).mean()
    return ordering(pooled, pd.Series(pooled.index))


def stage1_p_ordering(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Does the ranking of P hold at every R and width (against `p_reference`)? Whether it holds over the
    seeds is the `p_ordering` claim's (analysis.claims marks `holds` here)."""
    cells = _stage1_factorial(final, metric, "stage1_p_ordering")
    reference = p_reference(final, metric)
    rows = []
    for (d, r), g in cells.groupby(["d", "R"]):
        ranking = ordering(rank_values(g[metric], metric), g["P"])
        expected = [p for p in reference if p in ranking]
        rows.append(
            {"d": d, "R": r, "ranking": _chain(ranking), "expected": _chain(expected), "holds": ranking == expected}
        )
    return pd.DataFrame(rows)


def stage1_variance(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Share of the variance of log-metric explained by P and by R, per width and pooled over widths."""
    cells = _stage1_factorial(final, metric, "stage1_variance")
    parts = [(str(d), variance_shares(g["log"], g[["P", "R"]])) for d, g in cells.groupby("d")]
    parts.append(("pooled", variance_shares(cells["log"], cells[["P", "R"]], within=cells["d"])))
    return pd.DataFrame([{"d": d, **{f"share_{k}": v for k, v in s.items()}} for d, s in parts])


def stage2_seeds(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Stage 2: mean and std over seeds of the ranking metric and every validation set's perplexity, per (d, P, R)."""
    rows = rows_of(final, (CONFIRM,), "stage2_seeds")
    require(rows, [*CONFIG, metric], "stage2_seeds")
    groups = rows.groupby(CONFIG)
    table = groups[list(dict.fromkeys([metric, *ppl_sets(rows)]))].agg(["mean", "std"])  # the ranking metric first
    table.columns = [f"{s}_{stat}" for s, stat in table.columns]
    table.insert(0, "seeds", groups.size())
    return table.reset_index().rename(columns=SHORT)


def stage2_best(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The best R per width (best seed mean of the metric)."""
    table = stage2_seeds(final, metric)
    best = best_cells(rows_of(final, (CONFIRM,), "stage2_best"), ["d_model"], ["n_loops", "n_prelude"], metric)
    columns = ["d", "P", "R", "seeds", f"{metric}_mean", f"{metric}_std", "exact_tie"]
    return best.merge(table, on=["d", "P", "R"])[columns]


def reversal(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per width: the Stage-1 pick of R (at the stage-2 P) and the Stage-2 best R. Whether Stage 2 reverses
    or confirms the pick, over its seeds, is the `reversal` claim's (analysis.claims marks it here)."""
    rows_of(final, (CONFIRM,), "reversal")
    best2 = stage2_best(final, metric)[["d", "P", "R"]].rename(columns={"R": "stage2_R"})
    screen = rows_of(final, (SCREEN,), "reversal")
    picks = best_cells(screen, ["d_model", "n_prelude"], ["n_loops"], metric)[["d", "P", "R"]]
    picks = picks.rename(columns={"R": "stage1_R"})
    return best2.merge(picks, on=["d", "P"], how="left")[["d", "P", "stage1_R", "stage2_R"]]


def reversal_cells(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The (d, R) cells both stages ran at the stage-2 P, side by side (what the Spearman is over)."""
    stage2 = stage2_seeds(final, metric)[["d", "P", "R", f"{metric}_mean"]]
    stage1 = stage1_cells(final, metric, "reversal_cells")
    cells = stage1.merge(stage2, on=["d", "P", "R"]).sort_values(["d", "R"])
    return cells.rename(columns={metric: f"stage1_{metric}", f"{metric}_mean": f"stage2_{metric}"})


def parity(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """CART against dense per validation set; gap = (dense - CART) / CART x 100, negative = dense better. The
    shallower dense model is stored-parameter parity, the deeper effective; CART is the parity stage's, else
    stage 2's best R at the width."""
    dense = rows_of(final, (PARITY,), "parity", model="dense", base_only=False)
    require(dense, ["d_model", "n_layers", metric], "parity")
    rows = []
    for d, at_d in dense.groupby("d_model"):
        cart, source = parity_cart(final, metric, d)
        depths = sorted(at_d["n_layers"].unique())
        names = ["stored", "effective"] if len(depths) == 2 else [f"L{n}" for n in depths]
        for name, depth in zip(names, depths, strict=True):
            layer = at_d[at_d["n_layers"] == depth]
            for s in ppl_sets(layer):
                c, x = cart[s], layer[s]
                rows.append(
                    {
                        "parity": name,
                        "d": d,
                        "L": depth,
                        "cart": source,
                        "metric": s,
                        "cart_mean": c.mean(),
                        "cart_std": c.std(),
                        "dense_mean": x.mean(),
                        "dense_std": x.std(),
                        "seeds": f"{c.count()}/{x.count()}",
                        "gap_pct": (x.mean() - c.mean()) / c.mean() * 100,
                    }
                )
    return pd.DataFrame(rows)


def parity_cart(final: pd.DataFrame, metric: str, d: int) -> tuple[pd.DataFrame, str]:
    """The CART runs dense is measured against at width d, and where they came from."""
    cart = select(final, (PARITY,))
    cart = cart[cart["d_model"] == d] if not cart.empty else cart
    if not cart.empty:
        p, r = cart["n_prelude"].mode()[0], cart["n_loops"].mode()[0]
        return cart, f"parity P={p} R={r}"
    best = stage2_best(final, metric)
    best = best[best["d"] == d]
    if best.empty:
        raise AnalysisError(f"table 'parity' needs CART runs at d={d} in stage parity or 2; the input has none")
    p, r = best["P"].iloc[0], best["R"].iloc[0]
    cart = matching(select(final, (CONFIRM,)), pd.Series({"d_model": d, "n_prelude": p, "n_loops": r}))
    return cart, f"stage 2 P={p} R={r}"


def ablation_runs(final: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(every ablations run with its `switch`, the stage's variant name (single_loop's R=1 is one too); the
    `base` runs each is measured against; every run of the base's configuration in ablations, 2 and parity)."""
    rows = rows_of(final, (ABLATIONS,), "ablations", base_only=False)
    require(rows, [*CONFIG, metric], "ablations")
    named = VARIANT_AXIS if VARIANT_AXIS in rows and rows[VARIANT_AXIS].notna().all() else "variant"
    rows = rows.assign(switch=rows[named].astype(str))
    base = rows[rows["switch"] == "base"]
    if base.empty:
        raise AnalysisError("table 'ablations' needs the ablations stage's 'base' variant: every switch's baseline")
    configs = set(base["config"]) if "config" in base else set()
    every = select(final, (ABLATIONS, CONFIRM, PARITY), base_only=False)
    noise = every[every["config"].isin(configs)] if configs else matching(every, base[CONFIG].iloc[0])
    return rows, base, noise


def ablations(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Each switch against the baseline: delta % (positive = worse where lower is better) and the base's seed
    s.d. over its distinct runs. Whether a switch hurts is the `ablation` claim's (analysis.claims marks it)."""
    rows, reference, noise = ablation_runs(final, metric)
    out = []
    for switch, g in rows[rows["switch"] != "base"].groupby("switch"):
        for s in ppl_sets(g):
            ref, value = reference[s].mean(), g[s].mean()
            out.append(
                {
                    "variant": switch,
                    "metric": s,
                    "base": ref,
                    "value": value,
                    "delta_pct": (value - ref) / ref * 100,
                    "base_seed_std": noise[s].std(),
                    "base_seeds": int(noise[s].notna().sum()),
                }
            )
    return pd.DataFrame(out)


def variable_r(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Every validation set against inference R; the R the model was trained at is marked."""
    return _by_inference_r(final, metric, "variable_r", ppl_sets)


def variable_r_bench(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Every lm-eval task's scores against inference R (the paper's variable-R benchmark table)."""
    return _by_inference_r(final, metric, "variable_r_bench", bench_sets)


def inference_runs(final: pd.DataFrame, name: str) -> pd.DataFrame:
    """The variable-R evaluations with R (the inference loop count) and trained_R (the model's own)."""
    rows = rows_of(final, (VARIABLE_R,), name)
    has_eval = "eval_n_loops" in rows and rows["eval_n_loops"].notna().any()
    trained = "trained_n_loops" if "trained_n_loops" in rows else ("n_loops" if has_eval else None)
    return rows.assign(
        R=rows["eval_n_loops"] if has_eval else rows["n_loops"], trained_R=rows[trained] if trained else pd.NA
    )


def _by_inference_r(
    final: pd.DataFrame, metric: str, name: str, columns: Callable[[pd.DataFrame], list[str]]
) -> pd.DataFrame:
    rows = inference_runs(final, name)
    require(rows, ["d_model", "n_prelude", "R", metric], name)
    if not columns(rows):
        raise AnalysisError(f"table {name!r} needs lm-eval results (bench_* columns); these runs have none")
    keys = ["d_model", "n_prelude", "trained_R", "R"]
    table = rows.groupby(keys, dropna=False)[columns(rows)].mean().reset_index().rename(columns=SHORT)
    table.insert(4, "trained", table["R"] == table["trained_R"])
    return table


def benchmarks(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The paper's benchmark table: each width's best Stage-2 run at its trained R, one row per shot count."""
    rows = rows_of(final, (BENCHMARKS,), "benchmarks")
    require(rows, ["d_model", "n_prelude", "n_loops"], "benchmarks")
    if not bench_sets(rows):
        raise AnalysisError("table 'benchmarks' needs lm-eval results (bench_* columns); these runs have none")
    shots = rows["num_fewshot"].fillna(0) if "num_fewshot" in rows else pd.Series(0, index=rows.index)
    rows = rows.assign(shots=shots.astype(int))
    keys = ["shots", "d_model", "n_prelude", "n_loops"]
    return rows.groupby(keys)[bench_sets(rows)].mean().reset_index().rename(columns=SHORT)


def rho(final: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Final rho per (stage, d, P, R) beside the value weight decay alone predicts for the run's recipe."""
    rows = rows_of(final, (SCREEN, CONFIRM, PARITY), "rho")
    require(rows, [*CONFIG, "rho", "step"], "rho")
    rows = rows[rows["rho"].notna() & rows["step"].notna()]
    rows = rows.assign(rho_wd_only=[_wd_only_at(row) for _, row in rows.iterrows()])
    groups = rows.groupby(["stage", *CONFIG])
    table = groups.agg(
        seeds=("rho", "size"),
        step=("step", "max"),
        rho=("rho", "mean"),
        rho_min=("rho", "min"),
        rho_max=("rho", "max"),
        rho_wd_only=("rho_wd_only", "mean"),
    )
    return table.reset_index().rename(columns=SHORT)


def _wd_only_at(row: pd.Series) -> float:
    """rho that weight decay alone gives at the row's step under its run's recipe."""
    recipe = recipe_of(row)
    return float(wd_only_rho(recipe)[min(int(row["step"]), recipe.steps)])


def _chain(levels: list) -> str:
    """A ranking as text, best first: '6 > 4 > 3 > 2'."""
    return " > ".join(str(level) for level in levels)
