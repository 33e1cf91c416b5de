"""How different the sites are: pairwise distances on released counts, and the shift type.

Which distance, and why:

* **Label prevalence — Jensen–Shannon distance** (square root of the JS divergence, base 2)
  between Bernoulli(p_a) and Bernoulli(p_b) per class labeled at both sites, averaged over
  those classes. It is symmetric, bounded in [0, 1], a true metric, and defined when a
  prevalence is 0 (KL divergence is not). Uncertain and unlabeled rows do not count.
* **Demographics — Jensen–Shannon distance** between the categorical distributions of sex,
  age bin, race and view over the *known* values, averaged over the attributes both sites
  record. Categories have no order, so a metric on unordered distributions fits.
* **Pixel intensity — Wasserstein-1** between the 256-level histograms on the [0, 1] scale
  (the area between the two cumulative distributions). Intensities are ordered: a slightly
  darker site is slightly different, a much darker one much different; JS would call any two
  non-overlapping histograms equally far apart. W1 is in intensity units (0.05 = a shift of
  5 % of the display range).

A suppressed cell is estimated from released numbers only: the group's undisclosed remainder
(its released total minus its released cells) shared evenly by its suppressed cells
(:func:`fedcxr.stats.merge.estimated_cells`); a group whose total was not released is left out.
:func:`shift_type` reads the target-vs-sources distances against thresholds measured on real
PneumoniaMNIST with ``fedcxr shift`` (see :data:`PIXEL_SHIFT_W1` and BENCHMARKS.md).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from fedcxr.stats import groups as G
from fedcxr.stats.merge import estimated_cells, merge_groups

#: W1 on [0, 1] at or above which the target's pixels count as shifted ("pixel" in the regime
#: map). Measured on real PneumoniaMNIST (``benchmarks/bench_stats_shift.py``, BENCHMARKS.md
#: "Shift diagnosis"): the map's ``none`` cells (the unshifted target) sit at W1 = 0.0117 from
#: their sources, its weakest ``pixel`` cells (``fedcxr shift --kind mix --level 2``) at 0.143;
#: 0.04 is their geometric midpoint, so a federation goes to the kind of cell whose measured
#: shift it is nearer to on a log scale. (Two IID sources: 0.0006–0.0016.)
PIXEL_SHIFT_W1 = 0.04
#: Label-prevalence JS distance between the map's PneumoniaMNIST targets and their sources (the
#: official test split against the train split): shown beside a federation's own for scale.
MAP_PREVALENCE_JS = 0.108
METRICS = {
    "labels": "mean Jensen–Shannon distance (base 2) of per-class prevalence, classes labeled at both",
    "demographics": "mean Jensen–Shannon distance (base 2) of sex, age bin, race and view over known values",
    "intensity": "Wasserstein-1 distance of the pixel-intensity histograms on [0, 1]",
}


def js_distance(p: Sequence[float], q: Sequence[float]) -> Optional[float]:
    """Jensen–Shannon distance (base 2) of two count or probability vectors; None if either is empty."""
    a, b = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if a.sum() <= 0 or b.sum() <= 0:
        return None
    a, b = a / a.sum(), b / b.sum()
    m = (a + b) / 2

    def kl(x: np.ndarray) -> float:
        keep = x > 0
        return float(np.sum(x[keep] * np.log2(x[keep] / m[keep])))

    return math.sqrt(max((kl(a) + kl(b)) / 2, 0.0))


def wasserstein1(p: Sequence[float], q: Sequence[float]) -> Optional[float]:
    """W1 of two histograms over the same equally spaced levels, in units of the full range [0, 1]."""
    a, b = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if a.sum() <= 0 or b.sum() <= 0 or len(a) != len(b) or len(a) < 2:
        return None
    gap = np.abs(np.cumsum(a / a.sum()) - np.cumsum(b / b.sum()))[:-1]
    return float(gap.sum() / (len(a) - 1))


def label_distance(a: dict, b: dict) -> Optional[float]:
    values = []
    for name in a:
        if G.group_class(name) is None or name not in b:
            continue
        pa, pb = estimated_cells(a[name]), estimated_cells(b[name])
        d = js_distance(pa[:2], pb[:2]) if pa is not None and pb is not None else None  # positive, negative
        if d is not None:
            values.append(d)
    return float(np.mean(values)) if values else None


def demographic_distance(a: dict, b: dict) -> Optional[float]:
    values = []
    for task in G.DEMOGRAPHICS:
        pa, pb = estimated_cells(a.get(task)), estimated_cells(b.get(task))
        if pa is not None and pb is not None:
            d = js_distance(pa[:-1], pb[:-1])  # the last cell is "unknown"
            if d is not None:
                values.append(d)
    return float(np.mean(values)) if values else None


def intensity_distance(a: dict, b: dict) -> Optional[float]:
    pa, pb = estimated_cells(a.get("intensity")), estimated_cells(b.get("intensity"))
    return wasserstein1(pa, pb) if pa is not None and pb is not None else None


DISTANCES = {"labels": label_distance, "demographics": demographic_distance, "intensity": intensity_distance}


def pairwise(payloads: dict[str, dict]) -> dict[str, Any]:
    """Site × site matrices of each distance (None where a pair has nothing to compare)."""
    sites = [s for s, p in payloads.items() if p.get("groups")]
    out: dict[str, Any] = {"sites": sites}
    for kind, fn in DISTANCES.items():
        matrix = [[fn(payloads[a]["groups"], payloads[b]["groups"]) for b in sites] for a in sites]
        out[kind] = {"metric": METRICS[kind], "matrix": _rounded(matrix)}
    return out


def target_vs_sources(payloads: dict[str, dict], target: str, sources: list[str]) -> dict[str, Optional[float]]:
    """Each distance between the target and the sources pooled (their released counts summed)."""
    pooled = merge_groups(payloads[s] for s in sources if payloads.get(s, {}).get("groups"))
    own = (payloads.get(target) or {}).get("groups") or {}
    return {kind: _round(fn(own, pooled)) if own and pooled else None for kind, fn in DISTANCES.items()}


def shift_type(distances: dict[str, Optional[float]]) -> dict[str, Any]:
    """The regime map's shift type the target-vs-sources distances point to, with the rule applied.

    ``pixel`` when the intensity W1 reaches :data:`PIXEL_SHIFT_W1`, else ``none``; ``unknown``
    without the target's or the sources' intensities. Label prevalence is not a dimension of the
    map: its distance is shown beside, for scale against the map's own (:data:`MAP_PREVALENCE_JS`).
    Shortcut and source label-noise shifts are invisible in counts and histograms: the diagnosis
    never places a federation in those rows.
    """
    w1, js = distances.get("intensity"), distances.get("labels")
    rule = f"pixel if W1(target, sources pooled) ≥ {PIXEL_SHIFT_W1}, else none"
    prevalence = "; " + prevalence_words(js)
    caveat = "shortcut and source label-noise shifts cannot be seen in these statistics"
    if w1 is None:
        return {"value": "unknown", "rule": rule, "caveat": caveat,
                "why": "no intensity histogram of the target or of the sources" + prevalence}
    pixels = (f"pixel intensities: Wasserstein-1 distance {w1:.4f} between the target's histogram and the sources' "
              "(0 = identical, 0.05 = a shift of 5 % of the display range) is ")
    if w1 >= PIXEL_SHIFT_W1:
        return {"value": "pixel", "rule": rule, "caveat": caveat,
                "why": f"{pixels}at or above {PIXEL_SHIFT_W1}, the line between the map's unshifted and "
                       f"pixel-shifted targets: a pixel shift{prevalence}"}
    return {"value": "none", "rule": rule, "caveat": caveat,
            "why": f"{pixels}below {PIXEL_SHIFT_W1}, the line between the map's unshifted and pixel-shifted "
                   f"targets: no pixel shift{prevalence}"}


def prevalence_words(js: Optional[float]) -> str:
    """The label-prevalence distance in words: what it measures, its scale, and the map's targets beside it."""
    if js is None:
        return "no class labeled at both the target and a source: label prevalence not compared"
    ratio = js / MAP_PREVALENCE_JS
    compared = ("less different from its sources than" if ratio < 0.8 else
                "more different from its sources than" if ratio > 1.25 else "about as different from its sources as")
    return (f"label prevalence: Jensen–Shannon distance {js:.3f} between the target's per-class positive rates and "
            f"the sources' (0 = the same rates, 1 = nothing in common), so the target's labels are {compared} the "
            f"map's targets were from theirs ({MAP_PREVALENCE_JS}); shown for scale, it does not choose the map's cell")


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(float(value), 6)


def _rounded(matrix: list[list[Optional[float]]]) -> list[list[Optional[float]]]:
    return [[_round(v) for v in row] for row in matrix]
