"""Regime-map rows from per-seed results: winner, runner-up, their paired interval, the corrected verdict.

The benchmark that measures the map (``benchmarks/regime_map.py``, ``build_regime_map.py``)
turns each cell's runs — one row per (method, seed, AUROC) — into the columns
:mod:`fedcxr.advice.regime` reads, the same way every time:

* methods whose target budget differs are left out (:func:`excluded_methods`: the methods whose
  protocol declares ``full_target_labels``, i.e. trains on every target label — ``Oracle``), and so
  is the chooser (``Selected``: one of the others, picked per seed);
* winner / runner-up: the two highest mean AUROCs over seeds; margin: their difference; the
  interval: a Student-t 95 % interval of their per-seed paired differences (unadjusted, shown);
* ``p_best``: the intersection-union p-value of "the winner beats every other method", times the
  number of methods for the winner's selection; ``p_adj``: Holm over every cell of the map;
  ``resolved`` when ``p_adj`` < 0.05 (:mod:`fedcxr.advice.verdicts` states the procedure and its
  sources). One row alone is adjusted over itself only: :func:`map_rows` adjusts over the map.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

from fedcxr.advice.verdicts import ALPHA, adjust_cells, best_test, ranked, t_interval

__all__ = ["CHOOSER", "by_method", "cell_row", "excluded_methods", "map_rows", "t_interval"]

#: the chooser's rows (``fedcxr sweep --select``: one of the other methods, picked per seed)
CHOOSER = "Selected"


def excluded_methods() -> tuple[str, ...]:
    """The rows left out of a cell's contest: the methods whose target budget differs from the others'
    (their protocol's ``full_target_labels``: a capability of the method, not a list of names kept
    here, DESIGN §1) and the chooser."""
    from fedcxr.pipeline.protocols import METHODS

    return tuple(name for name, spec in METHODS.items() if spec.build(name).full_target_labels) + (CHOOSER,)


def by_method(runs: Iterable[dict], exclude: Optional[Sequence[str]] = None) -> dict[str, dict[int, float]]:
    """method → seed → AUROC of one cell's runs (``exclude``: rows left out of the contest, default
    :func:`excluded_methods`)."""
    exclude = excluded_methods() if exclude is None else exclude
    out: dict[str, dict[int, float]] = {}
    for run in runs:
        if run["method"] in exclude:
            continue
        out.setdefault(str(run["method"]), {})[int(run["seed"])] = float(run["auroc"])
    return out


def cell_row(runs: Iterable[dict], *, shift: str, target_labels: int, rounds: int, source: str,
             methods: Sequence[str] = (), exclude: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """A map row from ``runs`` (dicts with ``method``, ``seed``, ``auroc``) of one cell; ``exclude``:
    :func:`excluded_methods` unless given. Its ``p_adj`` and ``resolved`` are this cell's alone
    (:func:`map_rows` adjusts them over the map)."""
    exclude = excluded_methods() if exclude is None else exclude
    seeds = by_method(runs, exclude)
    means = {m: t_interval(list(s.values()))[0] for m, s in seeds.items()}
    order = ranked(seeds)
    row: dict[str, Any] = {"shift": shift, "target_labels": int(target_labels), "rounds": int(rounds),
                           "winner": "", "runner_up": "", "margin": "", "ci_low": "", "ci_high": "",
                           "p_best": "", "p_adj": "", "resolved": "false",
                           "n_seeds": min((len(s) for s in seeds.values()), default=0), "n_methods": len(seeds)}
    if len(order) >= 2:
        win, second = order[0], order[1]
        _, lo, hi = t_interval([seeds[win][s] - seeds[second][s] for s in seeds[win] if s in seeds[second]])
        p_best = best_test(seeds)["p_best"]
        row.update(winner=win, runner_up=second, margin=_fmt(means[win] - means[second]),
                   ci_low=_fmt_bound(lo), ci_high=_fmt_bound(hi), p_best=_fmt_p(p_best), p_adj=_fmt_p(p_best),
                   resolved="true" if math.isfinite(p_best) and p_best < ALPHA else "false")
    for method in list(methods) or order:
        row[f"auroc__{method}"] = _fmt(means[method]) if method in means else ""
    row["source"] = source
    return row


def map_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The map's rows with ``p_adj`` (Holm over every row's ``p_best``) and ``resolved`` set."""
    p_best = [float(r["p_best"]) if str(r.get("p_best", "")) != "" else math.nan for r in rows]
    return [{**row, "p_adj": _fmt_p(p_adj), "resolved": "true" if resolved else "false"}
            for row, (p_adj, resolved) in zip(rows, adjust_cells(p_best))]


def _fmt(value: float) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _fmt_p(value: float) -> str:
    """A p-value to 4 significant digits (blank when undefined): a small one stays readable."""
    return "" if value is None or not math.isfinite(value) else f"{value:.4g}"


def _fmt_bound(value: float) -> str:
    """An interval bound: 4 decimals, unless that would round a bound beside 0 to 0 — the reader
    checks that a resolved cell's interval excludes 0, so the sign must survive (e.g. ``2.4e-05``)."""
    text = _fmt(value)
    return f"{value:.1e}" if text and value != 0 and float(text) == 0 else text
