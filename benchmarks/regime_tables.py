"""The regime benchmark's tables from its runs: cells, corrected pairs, verdicts, the chooser's regret.

Input: the runs frame of ``bench_regime.collect`` — one row per run (``shift, labels, rounds, method,
seed, label_draw, auroc, val_auroc, target_passes, wall_s``, and ``chosen`` on the ``Selected`` rows).
The statistics are :mod:`fedcxr.advice.verdicts`' (the advice reads the same): Holm over every pair of
every cell for the pair statements, the intersection-union test with the winner's selection and Holm
over the cells for the verdicts. ``Selected`` (the chooser, one of the other methods per seed) is
shown but never in the contest.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from fedcxr.advice.cells import excluded_methods, t_interval
from fedcxr.advice.verdicts import ALPHA, best_test, holm, pair_lookup, pair_tests, ranked, selected_regret

CELL = ["shift", "labels", "rounds"]
SELECTED = "Selected"


def by_cell(runs: pd.DataFrame) -> dict[tuple, dict[str, dict[int, float]]]:
    """cell → method → seed → AUROC, the contest's methods only (no Oracle, no Selected)."""
    out: dict[tuple, dict[str, dict[int, float]]] = {}
    excluded = excluded_methods()
    for row in runs.itertuples(index=False):
        if row.method in excluded:
            continue
        key = (row.shift, int(row.labels), int(row.rounds))
        out.setdefault(key, {}).setdefault(row.method, {})[int(row.seed)] = float(row.auroc)
    return out


def cell_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per cell × method: mean test AUROC and 95 % t-interval over seeds, n, mean validation AUROC of
    the scored round, the target's passes over its labeled rows and the run's training seconds."""
    rows = []
    for key, group in runs.groupby([*CELL, "method"]):
        mean, lo, hi = t_interval(group["auroc"].tolist())
        rows.append({**dict(zip([*CELL, "method"], key)), "n": len(group), "mean": mean, "lo": lo, "hi": hi,
                     "val_mean": _mean(group, "val_auroc"), "target_passes": _mean(group, "target_passes"),
                     "wall_s": _mean(group, "wall_s")})
    return pd.DataFrame(rows, columns=[*CELL, "method", "n", "mean", "lo", "hi", "val_mean", "target_passes", "wall_s"])


def _mean(group: pd.DataFrame, column: str) -> float:
    if column not in group:
        return math.nan
    values = pd.to_numeric(group[column], errors="coerce").dropna()
    return float(values.mean()) if len(values) else math.nan


def pair_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the winner (highest mean) against every other method, paired by seed — the mean
    difference, its unadjusted 95 % t-interval, the two-sided p and Holm's ``p_adj`` over every pair
    of every cell; ``behind`` when ``p_adj`` < α (the other method is behind the winner), else ``tied``."""
    cells = by_cell(runs)
    lookup = pair_lookup(pair_tests(cells))
    rows = []
    for key, methods in cells.items():
        order = ranked(methods)
        winner = order[0]
        for rank, other in enumerate(order[1:], start=2):
            diffs = [methods[winner][s] - methods[other][s] for s in methods[winner] if s in methods[other]]
            mean, lo, hi = t_interval(diffs)
            test = lookup[(key, winner, other)]
            rows.append({**dict(zip(CELL, key)), "winner": winner, "other": other, "other_rank": rank, "n": len(diffs),
                         "diff": mean, "lo": lo, "hi": hi, "p": test["p"], "p_adj": test["p_adj"],
                         "verdict": "behind" if test["significant"] and mean > 0 else "tied"})
    columns = [*CELL, "winner", "other", "other_rank", "n", "diff", "lo", "hi", "p", "p_adj", "verdict"]
    return pd.DataFrame(rows, columns=columns)


def verdict_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: winner, runner-up, margin [unadjusted 95 %], ``p_best`` (intersection-union ×
    k), ``p_adj`` (Holm over the cells in ``runs``), ``resolved``, and the chooser's regret."""
    cells = by_cell(runs)
    selected = runs.loc[runs["method"] == SELECTED]
    rows = []
    for key, methods in cells.items():
        order = ranked(methods)
        row = {**dict(zip(CELL, key)), "winner": order[0], "runner_up": order[1] if len(order) > 1 else "",
               "n_methods": len(order), "n_seeds": min(len(s) for s in methods.values())}
        if len(order) > 1:
            w, r = methods[order[0]], methods[order[1]]
            mean, lo, hi = t_interval([w[s] - r[s] for s in w if s in r])
            test = best_test(methods)
            row.update(margin=mean, lo=lo, hi=hi, p_best=test["p_best"], weakest=test["weakest"])
        mine = selected.loc[(selected[CELL] == pd.Series(dict(zip(CELL, key)))).all(axis=1)]
        if len(mine):
            regret = selected_regret(methods, dict(zip(mine["seed"].astype(int), mine["auroc"].astype(float))))
            chosen = mine["chosen"].value_counts()
            row.update(selected_n=regret["n"], selected_regret=regret["regret"], selected_lo=regret["lo"],
                       selected_hi=regret["hi"], selected_choices="; ".join(f"{m} {c}" for m, c in chosen.items()))
        rows.append(row)
    table = pd.DataFrame(rows)
    if len(table):
        adjusted = holm(table.get("p_best", pd.Series([math.nan] * len(table))).tolist())
        table["p_adj"] = adjusted
        table["resolved"] = [bool(np.isfinite(p) and p < ALPHA) for p in adjusted]
    columns = [*CELL, "winner", "runner_up", "n_methods", "n_seeds", "margin", "lo", "hi", "p_best", "weakest",
               "p_adj", "resolved", "selected_n", "selected_regret", "selected_lo", "selected_hi", "selected_choices"]
    return table.reindex(columns=columns)


def versus_table(runs: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """This variant − another, per cell × method, paired by seed (a changed default, e.g. 8 steps vs one
    epoch a round); Holm over the table's rows (two-sided paired t)."""
    from fedcxr.advice.verdicts import paired_p

    keys = [*CELL, "method", "seed"]
    both = runs[[*keys, "auroc"]].merge(other[[*keys, "auroc"]], on=keys, suffixes=("", "_other"))
    rows = []
    for key, group in both.groupby([*CELL, "method"]):
        mean, lo, hi = t_interval((group["auroc"] - group["auroc_other"]).tolist())
        seeds = group["seed"].astype(int).tolist()
        p, _ = paired_p(dict(zip(seeds, group["auroc"])), dict(zip(seeds, group["auroc_other"])), "two-sided")
        rows.append({**dict(zip([*CELL, "method"], key)), "n": len(group), "mean": group["auroc"].mean(),
                     "mean_other": group["auroc_other"].mean(), "diff": mean, "lo": lo, "hi": hi, "p": p})
    table = pd.DataFrame(rows, columns=[*CELL, "method", "n", "mean", "mean_other", "diff", "lo", "hi", "p"])
    table["p_adj"] = holm(table["p"].tolist()) if len(table) else []
    return table


def markdown(cells: pd.DataFrame, pairs: pd.DataFrame, verdicts: pd.DataFrame, methods: Sequence[str]) -> str:
    """Per cell: the verdict line, then each method's mean [interval], its target passes, and its
    paired margin behind the winner with Holm's p_adj."""
    out = []
    order = {m: i for i, m in enumerate([*methods, SELECTED])}
    for key, group in cells.groupby(CELL):
        shift, labels, rounds = key
        out.append(f"### {shift}, {labels} target labels, {rounds} rounds\n")
        verdict = verdicts.loc[(verdicts[CELL] == pd.Series(dict(zip(CELL, key)))).all(axis=1)]
        if len(verdict):
            v = verdict.iloc[0]
            state = "**resolved**" if bool(v["resolved"]) else "unresolved"
            out.append(f"Winner {v['winner']}: p_best {_p(v['p_best'])}, Holm p_adj {_p(v['p_adj'])} over the "
                       f"table's {len(verdicts)} cells — {state}."
                       + (f" Selected (the chooser) regret {_interval(v['selected_regret'], v['selected_lo'], v['selected_hi'], True)}"
                          f" over {int(v['selected_n'])} seeds; chose {v['selected_choices']}."
                          if pd.notna(v.get("selected_regret")) else "") + "\n")
        out.append("| method | n | target test AUROC, mean [95% t-interval over seeds] | val AUROC | target passes | "
                   "winner − method, paired [95%], Holm p_adj |")
        out.append("|---|---|---|---|---|---|")
        best = group.loc[group["method"] != SELECTED, "mean"].max()
        margins = pairs.loc[(pairs[CELL] == pd.Series(dict(zip(CELL, key)))).all(axis=1)].set_index("other")
        for _, row in group.sort_values("method", key=lambda s: s.map(lambda m: order.get(m, 99))).iterrows():
            text = _interval(row["mean"], row["lo"], row["hi"])
            if row["method"] != SELECTED and math.isclose(row["mean"], best):
                text, margin = f"**{text}**", "winner"
            elif row["method"] in margins.index:
                m = margins.loc[row["method"]]
                margin = f"{_interval(m['diff'], m['lo'], m['hi'], signed=True)}, {_p(m['p_adj'])} ({m['verdict']})"
            else:
                margin = ""
            passes = "" if not np.isfinite(row["target_passes"]) else f"{row['target_passes']:.0f}"
            val = "" if not np.isfinite(row["val_mean"]) else f"{row['val_mean']:.3f}"
            out.append(f"| {row['method']} | {row['n']} | {text} | {val} | {passes} | {margin} |")
        out.append("")
    return "\n".join(out)


def _p(value) -> str:
    return "" if value is None or not np.isfinite(float(value)) else f"{float(value):.2g}"


def _interval(mean: float, lo: float, hi: float, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    if not np.isfinite(lo):
        return f.format(mean)
    return f"{f.format(mean)} [{f.format(lo)}, {f.format(hi)}]"
