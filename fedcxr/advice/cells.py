"""One regime-map row from per-seed results: winner, runner-up and their paired interval.

The benchmark that measures the map (and ``benchmarks/build_regime_map.py`` for the cells
measured before it) turns each cell's runs — one row per (method, seed, AUROC) — into the
columns :mod:`fedcxr.advice.regime` reads, the same way every time:

* methods whose target budget differs are left out (:func:`excluded_methods`: the methods whose
  protocol declares ``full_target_labels``, i.e. trains on every target label);
* winner / runner-up: the two highest mean AUROCs over seeds;
* margin: their difference; the interval: a Student-t 95 % interval of the per-seed paired
  differences (seeds both methods ran); ``resolved`` when it excludes 0.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence



def excluded_methods() -> tuple[str, ...]:
    """The methods whose target budget differs from the others' (their protocol's ``full_target_labels``):
    a capability of the method, not a list of names kept here (DESIGN §1)."""
    from fedcxr.pipeline.protocols import METHODS

    return tuple(name for name, spec in METHODS.items() if spec.build(name).full_target_labels)


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval of the mean (NaN half-width below two values)."""
    from scipy import stats

    x = [float(v) for v in values if math.isfinite(float(v))]
    if not x:
        return math.nan, math.nan, math.nan
    mean = sum(x) / len(x)
    if len(x) < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1)) * sd / math.sqrt(len(x))
    return mean, mean - half, mean + half


def cell_row(runs: Iterable[dict], *, shift: str, target_labels: int, rounds: int, source: str,
             methods: Sequence[str] = (), exclude: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """A map row from ``runs`` (dicts with ``method``, ``seed``, ``auroc``) of one cell; ``exclude``:
    :func:`excluded_methods` unless given."""
    exclude = excluded_methods() if exclude is None else exclude
    by_method: dict[str, dict[int, float]] = {}
    for run in runs:
        if run["method"] in exclude:
            continue
        by_method.setdefault(str(run["method"]), {})[int(run["seed"])] = float(run["auroc"])
    means = {m: t_interval(list(seeds.values()))[0] for m, seeds in by_method.items()}
    ranked = sorted(means, key=lambda m: -means[m])
    row: dict[str, Any] = {"shift": shift, "target_labels": int(target_labels), "rounds": int(rounds),
                           "winner": "", "runner_up": "", "margin": "", "ci_low": "", "ci_high": "",
                           "resolved": "false", "n_seeds": min((len(s) for s in by_method.values()), default=0)}
    if len(ranked) >= 2:
        win, second = ranked[0], ranked[1]
        paired = [by_method[win][s] - by_method[second][s] for s in by_method[win] if s in by_method[second]]
        margin, lo, hi = t_interval(paired)
        row.update(winner=win, runner_up=second, margin=_fmt(means[win] - means[second]),
                   ci_low=_fmt_bound(lo), ci_high=_fmt_bound(hi),
                   resolved="true" if math.isfinite(lo) and (lo > 0 or hi < 0) else "false")
    for method in list(methods) or ranked:
        row[f"auroc__{method}"] = _fmt(means[method]) if method in means else ""
    row["source"] = source
    return row


def _fmt(value: float) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _fmt_bound(value: float) -> str:
    """An interval bound: 4 decimals, unless that would round a bound beside 0 to 0 — the reader
    checks that a resolved cell's interval excludes 0, so the sign must survive (e.g. ``2.4e-05``)."""
    text = _fmt(value)
    return f"{value:.1e}" if text and value != 0 and float(text) == 0 else text
