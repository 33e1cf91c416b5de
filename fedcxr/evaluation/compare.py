"""Method comparison across runs: the papers' table and significance tests against a baseline.

Table: rows = methods, columns = evaluated sites (labelled with the run's target when a run
evaluates a site other than its target), cell = mean AUROC over defined classes, plus
accuracy for binary tasks. One run in a cell: 95% CI by patient-level bootstrap. Several runs
sharing (method, target), i.e. seeds: mean ± SD over seeds (SD with ddof=1), as the papers
report. The best cell per column is flagged (bold in markdown).

Tests against ``baseline`` (per column, on the same test rows, joined on (site, row_key)):

* DeLong paired test per class, on the first seed pair (see below), **clustered by patient**
  (Obuchowski 1997, clusters = ``patient_key``): a patient's images are not independent
  evidence. Across the classes of one (method, column) the p-values are adjusted for the
  false-discovery rate (Benjamini–Hochberg, ``q_value``); stars and ``significant`` use q;
* paired t-test over class AUROCs (surgical-aggregation paper, "granular class-level AUROC"):
  with several seeds every (seed pair, class) is one pair of the test; one test per cell, so
  its stars use its p-value.

Seed pairing: runs of the two methods with the same seed are paired; when the two methods
share no seed, the lowest seed of each is paired (recorded as ``paired_by``). The DeLong
test uses the first pair (lowest common seed), so it compares two concrete models.

Federated runs whose predictions never left the sites (FLARE cross-site evaluation) have no
``predictions/<split>.parquet``; their cells come from the site summaries in ``report.json``
(:func:`fedcxr.evaluation.report_table.load_summary_results`), and their DeLong rows are
empty (no rows to pair) while the t-test over class AUROCs still runs.

Small samples (:mod:`fedcxr.evaluation.small_sample`): a cell says how many of the classes behind
its mean are small-sample (fewer than 10 positive or 10 negative patients; the most over its
seeds) and which method made its interval; DeLong rows and t-test pairs of such classes are
flagged, and the Markdown marks them (``†k/K``, "too few cases").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
from scipy import sparse, stats
from scipy.sparse.csgraph import connected_components

from fedcxr.errors import UserError
from fedcxr.escape import md, to_csv_text
from fedcxr.evaluation import metrics, small_sample
from fedcxr.evaluation.report import evaluate_rows, is_binary_task
from fedcxr.evaluation.report_files import write_json, write_text
from fedcxr.evaluation.report_markdown import fmt, fmt_ci
from fedcxr.evaluation.report_table import load_summary_results
from fedcxr.evaluation.runs import ID_COLUMNS, load_predictions, load_run_info, predictions_path
from fedcxr.wording import count

#: 2: DeLong clustered by patient_key; per-class q_value (BH), significant, n_patients.
#: 3: the small-sample rule: cells' auroc_small_sample_classes, auroc_classes, auroc_ci_method, acc_small_sample;
#: DeLong rows' small_sample; the t-test's n_small_sample_pairs; ci.small_sample states the rule.
SCHEMA_VERSION = 3
SIGNIFICANCE_LEVEL = 0.05
DELONG_METHOD = "patient-clustered DeLong (Obuchowski 1997), clusters = patient_key"
FDR_METHOD = "Benjamini-Hochberg over the classes of one (method, column) comparison"


@dataclass
class _Run:
    path: Path
    info: dict
    predictions: pd.DataFrame
    sites: list[str]
    results: dict[str, dict] = field(default_factory=dict)  # site → evaluate_rows result
    from_summaries: bool = False  # results from the sites' summaries (report_table); no predictions here

    @property
    def method(self) -> str:
        return self.info["method"]

    @property
    def seed(self) -> int:
        return int(self.info["seed"])

    @property
    def target(self) -> Optional[str]:
        return self.info.get("target")


def _column_label(target: Optional[str], site: str) -> str:
    return site if target is None or target == site else f"{site} (target {target})"


def _load_runs(run_dirs: Sequence[Path | str], split: str) -> list[_Run]:
    if not run_dirs:
        raise UserError("no run directories given")
    runs, seen = [], {}
    for run_dir in run_dirs:
        info = load_run_info(run_dir)
        summaries = None if predictions_path(run_dir, split).is_file() else load_summary_results(run_dir, split)
        if summaries is not None:  # a federated run: only the sites' summaries left the sites
            frame = pd.DataFrame(columns=list(ID_COLUMNS) + [f"{k}__{c}" for c in info["classes"]
                                                              for k in ("label", "prob")])
        else:
            frame = load_predictions(run_dir, split, info["classes"])
        key = (info["method"], info.get("target"), int(info["seed"]))
        if key in seen:
            raise UserError(f"{run_dir} and {seen[key]} are both method {key[0]!r}, target {key[1]!r}, "
                            f"seed {key[2]}: pass one of them")
        seen[key] = run_dir
        if frame.duplicated(["site", "row_key"]).any():
            raise UserError(f"{predictions_path(run_dir, split)}: a row_key appears twice for one site "
                            "(rows must be unique per (site, row_key))")
        present = list(dict.fromkeys(frame["site"]))
        wanted = [s for s in info.get("eval_sites") or [] if s in present]
        if summaries is not None:
            present = list(summaries)
            wanted = [s for s in info.get("eval_sites") or [] if s in present]
        runs.append(_Run(Path(run_dir), info, frame, wanted + [s for s in present if s not in wanted],
                         results=dict(summaries or {}), from_summaries=summaries is not None))
    return runs


def compare_runs(
    run_dirs: Sequence[Path | str],
    *,
    baseline: Optional[str] = None,
    split: str = "test",
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Compare runs (see module doc). Returns the content of ``comparison.json``."""
    runs = _load_runs(run_dirs, split)
    methods = list(dict.fromkeys(r.method for r in runs))
    if baseline is not None and baseline not in methods:
        raise UserError(f"--baseline {baseline!r} is not among the methods of these runs: {', '.join(methods)}")
    groups: dict[tuple, list[_Run]] = {}
    for run in runs:
        groups.setdefault((run.method, run.target), []).append(run)
    for group in groups.values():
        group.sort(key=lambda r: r.seed)
        boot = n_boot if len(group) == 1 else 0  # several seeds: spread over seeds, no CI
        for run in group:
            if run.from_summaries:
                continue
            binary = is_binary_task(run.info["classes"])
            for site in run.sites:
                rows = run.predictions[run.predictions["site"] == site]
                run.results[site] = evaluate_rows(rows, run.info["classes"], n_boot=boot, seed=seed,
                                                  split=split, binary=binary)
    columns = _columns(runs)
    table = []
    for method in methods:
        cells = {c["label"]: _cell(groups, method, c) for c in columns}
        table.append({"method": method, "cells": {k: v for k, v in cells.items() if v is not None}})
    _mark_best(table, columns)
    result = {
        "schema_version": SCHEMA_VERSION,
        "kind": "fedcxr.evaluation.comparison",
        "split": split,
        "baseline": baseline,
        "ci": {"level": 0.95, "method": "patient-level bootstrap (percentile), one run per cell",
               "n_boot": int(n_boot), "seed": int(seed), "small_sample": small_sample.rule_info()},
        "spread": "mean ± SD (ddof=1) over seeds when several runs share (method, target)",
        "delong": {"method": DELONG_METHOD, "fdr": FDR_METHOD, "significance_level": SIGNIFICANCE_LEVEL},
        "runs": [{"run_dir": str(r.path), "method": r.method, "seed": r.seed, "target": r.target,
                  "sites": r.sites} for r in runs],
        "columns": columns,
        "table": table,
        "tests": [],
    }
    if baseline is not None:
        result["tests"] = [t for m in methods if m != baseline for c in columns
                           if (t := _tests(groups, m, baseline, c)) is not None]
    return result


def _columns(runs: list[_Run]) -> list[dict[str, Any]]:
    columns: dict[tuple, dict] = {}
    for run in runs:
        for site in run.sites:
            key = (run.target, site)
            col = columns.setdefault(key, {"label": _column_label(run.target, site), "target": run.target,
                                           "site": site, "binary": True})
            col["binary"] = col["binary"] and is_binary_task(run.info["classes"])
    labels = [c["label"] for c in columns.values()]
    for col in columns.values():  # site X scored by runs without a target and by runs targeting X
        if col["target"] is None and labels.count(col["label"]) > 1:
            col["label"] = f"{col['site']} (no target)"
    return list(columns.values())


def _runs_for(groups, method: str, column: dict) -> list[_Run]:
    return [r for r in groups.get((method, column["target"]), []) if column["site"] in r.results]


def _cell(groups, method: str, column: dict) -> Optional[dict[str, Any]]:
    runs = _runs_for(groups, method, column)
    if not runs:
        return None
    results = [r.results[column["site"]] for r in runs]
    cell: dict[str, Any] = {"n_runs": len(runs), "seeds": [r.seed for r in runs],
                            "per_seed_auroc": [res["mean_auroc"] for res in results]}
    cell.update(_summary("auroc", [res["mean_auroc"] for res in results],
                         results[0]["mean_auroc_ci_low"], results[0]["mean_auroc_ci_high"]))
    cell.update(auroc_classes=max(len(res["mean_auroc_classes"]) for res in results),
                auroc_small_sample_classes=max(len(res.get("mean_auroc_small_sample_classes") or [])
                                               for res in results),
                auroc_ci_method=results[0].get("mean_auroc_ci_method") if len(results) == 1 else None)
    if column["binary"]:
        cell.update(_summary("acc", [res["accuracy"] for res in results],
                             results[0]["accuracy_ci_low"], results[0]["accuracy_ci_high"]))
        cell["acc_small_sample"] = any(bool(res.get("accuracy_small_sample")) for res in results)
    return cell


def _summary(name: str, values: list[float], ci_low: float, ci_high: float) -> dict[str, Any]:
    finite = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    out = {f"{name}_mean": float(finite.mean()) if finite.size else float("nan"),
           f"{name}_sd": float("nan"), f"{name}_ci_low": float("nan"), f"{name}_ci_high": float("nan"),
           f"{name}_n": int(finite.size)}
    if len(values) == 1:
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = ci_low, ci_high
    elif finite.size >= 2:
        out[f"{name}_sd"] = float(finite.std(ddof=1))
    return out


def _mark_best(table: list[dict], columns: list[dict]) -> None:
    for column in columns:
        for name in ("auroc", "acc"):
            cells = [row["cells"][column["label"]] for row in table if column["label"] in row["cells"]]
            values = [c.get(f"{name}_mean", np.nan) for c in cells]
            finite = [v for v in values if np.isfinite(v)]
            best = max(finite) if finite else None
            for c, v in zip(cells, values):
                if f"{name}_mean" in c:
                    c[f"best_{name}"] = bool(best is not None and np.isfinite(v) and v >= best - 1e-12)


# --------------------------------------------------------------------------- tests


def _seed_pairs(runs_a: list[_Run], runs_b: list[_Run]) -> tuple[list[tuple[_Run, _Run]], str]:
    by_seed = {r.seed: r for r in runs_b}
    pairs = [(a, by_seed[a.seed]) for a in runs_a if a.seed in by_seed]
    if pairs:
        return pairs, "seed"
    return [(runs_a[0], runs_b[0])], "lowest seed of each (no common seed)"


def _class_aurocs(run: _Run, site: str) -> dict[str, float]:
    return {r["class"]: r["auroc"] for r in run.results[site]["per_class"]}


def _small_classes(run: _Run, site: str) -> set[str]:
    return {r["class"] for r in run.results[site]["per_class"] if r.get("small_sample")}


def _tests(groups, method: str, baseline: str, column: dict) -> Optional[dict[str, Any]]:
    runs_m, runs_b = _runs_for(groups, method, column), _runs_for(groups, baseline, column)
    if not runs_m or not runs_b:
        return None
    site = column["site"]
    pairs, paired_by = _seed_pairs(runs_m, runs_b)
    a_vals, b_vals, small = [], [], []
    for run_m, run_b in pairs:
        am, ab = _class_aurocs(run_m, site), _class_aurocs(run_b, site)
        small_m, small_b = _small_classes(run_m, site), _small_classes(run_b, site)
        for cls in am:
            if cls in ab:
                a_vals.append(am[cls])
                b_vals.append(ab[cls])
                small.append(cls in small_m or cls in small_b)
    t, p = metrics.paired_ttest(a_vals, b_vals)
    n_pairs = int(np.sum(np.isfinite(a_vals) & np.isfinite(b_vals))) if a_vals else 0
    delong = _delong_per_class(pairs[0][0], pairs[0][1], site)
    return {"method": method, "baseline": baseline, "column": column["label"], "site": site,
            "target": column["target"], "paired_by": paired_by,
            "seed_pairs": [[a.seed, b.seed] for a, b in pairs],
            "ttest": {"t": t, "p_value": p, "n_pairs": n_pairs,
                      "n_small_sample_pairs": int(np.sum(np.isfinite(a_vals) & np.isfinite(b_vals) & np.array(small)))
                      if a_vals else 0,
                      "mean_difference": float(np.nanmean(np.array(a_vals) - np.array(b_vals)))
                      if n_pairs else float("nan")},
            **delong}


def _delong_per_class(run_m: _Run, run_b: _Run, site: str) -> dict[str, Any]:
    """Patient-clustered DeLong test per common class on the rows both runs predicted for ``site``,
    with Benjamini–Hochberg q-values across those classes."""
    fm = run_m.predictions[run_m.predictions["site"] == site]
    fb = run_b.predictions[run_b.predictions["site"] == site]
    classes = [c for c in run_m.info["classes"] if c in run_b.info["classes"]]
    keep_m = ["row_key", "patient_key"] + [f"{k}__{c}" for c in classes for k in ("label", "prob")]
    joined = fm[keep_m].merge(fb[keep_m], on="row_key", how="inner", suffixes=("", "__base"))
    clusters = patient_clusters(joined["patient_key"].to_numpy(dtype=object),
                                joined["patient_key__base"].to_numpy(dtype=object))
    rows = [_delong_row(joined, cls, clusters) for cls in classes]
    q_values = bh_adjust([r["p_value"] for r in rows])
    for row, q in zip(rows, q_values):
        row["q_value"] = q
        row["significant"] = bool(np.isfinite(q) and q < SIGNIFICANCE_LEVEL)
    return {"delong_seeds": [run_m.seed, run_b.seed], "n_rows_joined": int(len(joined)),
            "n_rows_only_method": int(len(fm) - len(joined)), "n_rows_only_baseline": int(len(fb) - len(joined)),
            "delong": rows}


def _delong_row(joined: pd.DataFrame, cls: str, clusters: np.ndarray) -> dict[str, Any]:
    """One class: labels the two runs agree on, clustered paired test, counts and a reason."""
    y = joined[f"label__{cls}"].to_numpy(dtype=float, na_value=np.nan)
    y_base = joined[f"label__{cls}__base"].to_numpy(dtype=float, na_value=np.nan)
    agree = (y == y_base) | (np.isnan(y) & np.isnan(y_base))
    y = np.where(agree, y, np.nan)
    auc1, auc2, z, p = metrics.clustered_delong_paired_test(
        y, joined[f"prob__{cls}"].to_numpy(dtype=float), joined[f"prob__{cls}__base"].to_numpy(dtype=float),
        clusters)
    labeled = ~np.isnan(y)
    reason = metrics.auroc_reason(y) or (None if np.isfinite(p) else
                                         "fewer than 2 patients with a positive or 2 with a negative row")
    cases = small_sample.count_cases(y, clusters)
    return {"class": cls, "auroc": auc1, "auroc_baseline": auc2, "z": z, "p_value": p,
            "n": int(labeled.sum()), "n_pos": int((y[labeled] == 1).sum()),
            "n_patients": int(np.unique(clusters[labeled]).size), "n_label_mismatch": int((~agree).sum()),
            "small_sample": cases.small, "pos_patients": cases.pos_patients, "neg_patients": cases.neg_patients,
            "reason": reason}


def patient_clusters(keys_a: np.ndarray, keys_b: np.ndarray) -> np.ndarray:
    """Cluster codes of joined rows whose two runs each give a ``patient_key``.

    Two rows are in one cluster when either run puts them with the same patient (connected
    components of the "same patient in run a or in run b" graph). When the runs agree, as they
    do on the same data, these are simply the patients; when they do not, merging is the
    conservative choice (it never treats possibly-correlated rows as independent).
    """
    code_a = pd.factorize(pd.Series(keys_a, dtype=object), use_na_sentinel=False)[0]
    code_b = pd.factorize(pd.Series(keys_b, dtype=object), use_na_sentinel=False)[0]
    n_a = int(code_a.max()) + 1 if code_a.size else 0
    n_b = int(code_b.max()) + 1 if code_b.size else 0
    size = n_a + n_b
    graph = sparse.coo_matrix((np.ones(code_a.size), (code_a, n_a + code_b)), shape=(size, size))
    _, labels = connected_components(graph, directed=False)
    return labels[code_a] if code_a.size else code_a


def bh_adjust(p_values: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg q-values of the finite ``p_values`` (NaN stays NaN, not counted).

    q_(i) = min_{j ≥ i} min(1, m · p_(j) / j) over the m finite p-values sorted ascending
    (``scipy.stats.false_discovery_control``, method ``"bh"``). Controls the expected share of
    false discoveries among the classes called significant at q < α.
    """
    p = np.asarray(p_values, dtype=float)
    q = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    if finite.any():
        q[finite] = stats.false_discovery_control(p[finite], method="bh")
    return [float(v) for v in q]


# --------------------------------------------------------------------------- write


def stars(p: Optional[float]) -> str:
    """Significance marks as in the surgical-aggregation paper's tables (of a p- or q-value)."""
    if p is None or not np.isfinite(p):
        return ""
    return "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < 0.05 else "ns"


def _fmt_p(p: Optional[float], name: str = "p") -> str:
    if p is None or not np.isfinite(p):
        return f"{name} n/a"
    return f"{name}<0.001" if p < 0.001 else f"{name}={p:.3f}"


def _cell_text(cell: Optional[dict], name: str) -> str:
    if cell is None:
        return "—"
    mean = cell.get(f"{name}_mean")
    if cell["n_runs"] > 1:
        text = "n/a" if not np.isfinite(mean) else (
            f"{mean:.3f} ± {cell[f'{name}_sd']:.3f} (n={cell[f'{name}_n']})"
            if np.isfinite(cell[f"{name}_sd"]) else f"{mean:.3f} (n={cell[f'{name}_n']})")
    else:
        text = fmt_ci(mean, cell[f"{name}_ci_low"], cell[f"{name}_ci_high"])
    text = f"**{text}**" if cell.get(f"best_{name}") else text
    return text + small_sample_mark(cell, name)


def small_sample_mark(cell: dict, name: str = "auroc") -> str:
    """`` †2/3`` after a mean AUROC when 2 of the 3 classes behind it are small-sample; `` †`` after an
    accuracy from fewer than 10 patients; ``""`` otherwise (the demo prints it too)."""
    if name == "acc":
        return " †" if cell.get("acc_small_sample") else ""
    small = cell.get("auroc_small_sample_classes") or 0
    return f" †{small}/{cell.get('auroc_classes', '?')}" if small else ""


#: the footnote of a table holding :func:`small_sample_mark` marks
SMALL_SAMPLE_FOOTNOTE = (f"†k/K: k of the K classes behind the mean have too few cases (fewer than "
                         f"{small_sample.MIN_CASES} positive or {small_sample.MIN_CASES} negative patients): their "
                         f"intervals are Newcombe score intervals, combined with the other classes' into the "
                         f"mean's interval; † after an accuracy: fewer than {small_sample.MIN_CASES} patients "
                         "(Wilson score interval). See each run's report.md.")


def comparison_frame(result: dict) -> pd.DataFrame:
    """``comparison.csv``: one row per (method, column)."""
    rows = []
    for row in result["table"]:
        for column in result["columns"]:
            cell = row["cells"].get(column["label"])
            if cell is None:
                continue
            rows.append({"method": row["method"], "column": column["label"], "target": column["target"],
                         "site": column["site"], "n_runs": cell["n_runs"],
                         "seeds": ";".join(str(s) for s in cell["seeds"]),
                         **{k: cell.get(k, np.nan) for k in (
                             "auroc_mean", "auroc_sd", "auroc_ci_low", "auroc_ci_high", "best_auroc",
                             "auroc_ci_method", "auroc_classes", "auroc_small_sample_classes",
                             "acc_mean", "acc_sd", "acc_ci_low", "acc_ci_high", "best_acc", "acc_small_sample")}})
    return pd.DataFrame(rows)


def tests_frame(result: dict) -> pd.DataFrame:
    """``comparison_tests.csv``: the t-test and every DeLong test, one row each."""
    rows = []
    for test in result["tests"]:
        base = {"method": test["method"], "baseline": test["baseline"], "column": test["column"],
                "paired_by": test["paired_by"]}
        t_p = test["ttest"]["p_value"]
        rows.append({**base, "test": "paired t-test over class AUROCs", "class": None,
                     "statistic": test["ttest"]["t"], "p_value": t_p, "q_value": np.nan,
                     "significant": bool(np.isfinite(t_p) and t_p < SIGNIFICANCE_LEVEL),
                     "n": test["ttest"]["n_pairs"], "difference": test["ttest"]["mean_difference"],
                     "seeds": ";".join(f"{a}/{b}" for a, b in test["seed_pairs"]),
                     "small_sample": bool(test["ttest"].get("n_small_sample_pairs")), "reason": None})
        for d in test["delong"]:
            rows.append({**base, "test": "DeLong", "class": d["class"], "statistic": d["z"],
                         "p_value": d["p_value"], "q_value": d["q_value"], "significant": d["significant"],
                         "n": d["n"], "difference": d["auroc"] - d["auroc_baseline"],
                         "seeds": "{}/{}".format(*test["delong_seeds"]), "small_sample": bool(d.get("small_sample")),
                         "reason": d["reason"]})
    return pd.DataFrame(rows)


def render_markdown(result: dict) -> str:
    columns = result["columns"]
    header, keys = ["Method"], []
    for c in columns:
        header.append(f"{c['label']} AUROC" if c["binary"] else c["label"])
        keys.append((c["label"], "auroc"))
        if c["binary"]:
            header.append(f"{c['label']} ACC")
            keys.append((c["label"], "acc"))
    lines = [f"# Method comparison ({md(result['split'])} split)", "",
             "Cells: mean AUROC over the classes with a defined AUROC (accuracy at threshold 0.5 for "
             f"binary tasks). One run: 95% CI by patient-level bootstrap ({result['ci']['n_boot']} "
             "resamples). Several seeds: mean ± SD over seeds (n = runs). Best per column in **bold**.", ""]
    lines += _md_table(header, [[row["method"]] + [_cell_text(row["cells"].get(label), name)
                                                   for label, name in keys] for row in result["table"]])
    seeds: dict[tuple, list[str]] = {}
    for r in result["runs"]:
        seeds.setdefault((r["method"], r["target"]), []).append(str(r["seed"]))
    runs = "; ".join(f"{md(m)}" + (f" (target {md(t)})" if t else "") + f" seed{'s' if len(s) > 1 else ''} "
                     f"{md(', '.join(s))}" for (m, t), s in seeds.items())
    lines += ["", f"Runs ({len(result['runs'])}): {runs}.", ""]
    if any(small_sample_mark(cell, name) for row in result["table"] for label, name in keys
           if (cell := row["cells"].get(label))):
        lines += [SMALL_SAMPLE_FOOTNOTE, ""]
    if result["baseline"] is not None:
        lines += _tests_markdown(result)
    return "\n".join(lines).rstrip() + "\n"


def _tests_markdown(result: dict) -> list[str]:
    baseline, tests = result["baseline"], result["tests"]
    labels = [c["label"] for c in result["columns"]]
    methods = [row["method"] for row in result["table"] if row["method"] != baseline]
    by_key = {(t["method"], t["column"]): t for t in tests}
    lines = [f"## Significance against {md(baseline)}", "",
             "Paired t-test over class AUROCs (classes defined for both; with several seeds one pair per "
             "seed and class). Cell: mean difference in AUROC, p-value, significance "
             "(*** p<0.001, ** p<0.01, * p<0.05, ns).", ""]
    rows = []
    for m in methods:
        cells = []
        for label in labels:
            t = by_key.get((m, label))
            if t is None or not np.isfinite(t["ttest"]["p_value"]):
                cells.append("—" if t is None else f"n/a ({t['ttest']['n_pairs']} class pair(s), needs 2)")
                continue
            tt = t["ttest"]
            small = tt.get("n_small_sample_pairs") or 0
            cells.append(f"{tt['mean_difference']:+.3f}, {_fmt_p(tt['p_value'])} {stars(tt['p_value'])}"
                         + (f" ({small} of {tt['n_pairs']} pairs with too few cases)" if small else ""))
        rows.append([m] + cells)
    lines += _md_table(["Method"] + labels, rows) + [""]
    lines += ["DeLong paired test per class on the same test images (first seed pair), clustered by "
              "patient (Obuchowski 1997). Cell: AUROC of the method vs the baseline, raw p-value, "
              "q-value (Benjamini–Hochberg false-discovery-rate adjustment across the classes of the "
              "column); significance marks use q (*** q<0.001, ** q<0.01, * q<0.05, ns).", ""]
    rows = []
    for m in methods:
        classes = list(dict.fromkeys(d["class"] for label in labels if (m, label) in by_key
                                     for d in by_key[(m, label)]["delong"]))
        for cls in classes:
            cells = []
            for label in labels:
                t = by_key.get((m, label))
                d = next((d for d in t["delong"] if d["class"] == cls), None) if t else None
                if d is None:
                    cells.append("—")
                elif not np.isfinite(d["auroc"]):
                    cells.append(f"n/a ({d['reason']})")
                else:
                    cells.append(f"{fmt(d['auroc'])} vs {fmt(d['auroc_baseline'])}, {_fmt_p(d['p_value'])}, "
                                 f"{_fmt_p(d['q_value'], 'q')} {stars(d['q_value'])}".rstrip()
                                 + (f" ({small_sample.too_few_words(d['n_pos'], d['n'] - d['n_pos'], d['pos_patients'], d['neg_patients'])}: the z-test is unreliable)"
                                    if d.get("small_sample") else ""))
            rows.append([m, cls] + cells)
    lines += _md_table(["Method", "Class"] + labels, rows) + [""]
    for t in tests:
        if t["n_rows_only_method"] or t["n_rows_only_baseline"] or any(d["n_label_mismatch"] for d in t["delong"]):
            mismatched = sum(int(d["n_label_mismatch"]) for d in t["delong"])
            lines.append(f"- {md(t['method'])} vs {md(baseline)} on {md(t['column'])}: "
                         f"{count(int(t['n_rows_joined']), 'image')} in both, {t['n_rows_only_method']} only in "
                         f"{md(t['method'])}, {t['n_rows_only_baseline']} only in {md(baseline)}; "
                         f"{count(mismatched, 'label disagreement')} left out of DeLong")
    return lines


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, every cell escaped (method and site names come from run directories)."""
    lines = ["| " + " | ".join(md(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(md(c) for c in r) + " |" for r in rows]


def write_comparison(result: dict, out_dir: Path | str) -> list[Path]:
    """Write ``comparison.md``, ``comparison.csv``, ``comparison.json`` (and, with a baseline,
    ``comparison_tests.csv``) into ``out_dir``."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: exists and is not a directory")
    paths = [out_dir / "comparison.md", out_dir / "comparison.csv", out_dir / "comparison.json"]
    write_text(paths[0], render_markdown(result))
    write_text(paths[1], to_csv_text(comparison_frame(result), float_format="%.6g"))
    write_json(paths[2], result)
    if result["tests"]:
        paths.append(out_dir / "comparison_tests.csv")
        write_text(paths[3], to_csv_text(tests_frame(result), float_format="%.6g"))
    return paths
