"""The global statistics: the released site payloads summed, and what follows from the sums.

Global cell = the sum of the sites' released cells; a suppressed (``null``) site cell adds
nothing, so a global cell is a lower bound wherever a site suppressed it (that site's section
shows where). A global cell is ``null`` only when every site's cell was. The same rule gives
the same numbers whether the sums are taken here (in-process) or by NVIDIA FLARE's
``StatisticsController`` (:mod:`fedcxr.flare.stats`), which receives suppressed cells as 0.

Derived values are computed from released counts only (post-processing, no extra privacy
cost): per-class prevalence ``positive / (positive + negative)`` (globally: pooled over the
sites that released both cells), and intensity quantiles from the summed 256-level histogram
(the smallest level whose cumulative share reaches q, on the [0, 1] scale of the cache:
level / 255).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import numpy as np

from fedcxr.stats import groups as G

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def merge_groups(payloads: Iterable[dict]) -> dict[str, dict]:
    """Sum the groups of released payloads (``null`` cells add nothing; all-null stays null)."""
    out: dict[str, dict] = {}
    for payload in payloads:
        for name, group in (payload.get("groups") or {}).items():
            cells = group.get("counts") or []
            entry = out.setdefault(name, {"count": None, "counts": [None] * len(cells)})
            if len(entry["counts"]) != len(cells):
                raise ValueError(f"group {name}: {len(cells)} cells, another site sent {len(entry['counts'])}")
            entry["count"] = _add(entry["count"], group.get("count"))
            entry["counts"] = [_add(a, b) for a, b in zip(entry["counts"], cells)]
    return {name: out[name] for name in _ordered(out)}


def _add(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if b is None:
        return a
    return int(b) if a is None else int(a) + int(b)


def _ordered(names: Iterable[str]) -> list[str]:
    every = G.all_groups([c for c in (G.group_class(n) for n in names) if c])
    return [n for n in every if n in set(names)]


def cells(group: Optional[dict]) -> np.ndarray:
    """A group's cells as numbers, null → 0 (for distances, figures, quantiles)."""
    if not group:
        return np.zeros(0, dtype=np.int64)
    return np.array([0 if v is None else int(v) for v in group.get("counts") or []], dtype=np.int64)


def estimated_cells(group: Optional[dict]) -> Optional[np.ndarray]:
    """A group's cells with each suppressed cell given an even share of the group's undisclosed
    remainder (released total − released cells): exact when nothing is suppressed, and computed
    from released numbers only. ``None`` when the group's total itself was not released."""
    if not group or group.get("count") is None:
        return None
    values = group.get("counts") or []
    hidden = [v is None for v in values]
    shown = np.array([0.0 if v is None else float(v) for v in values])
    if any(hidden):
        remainder = max(float(group["count"]) - float(shown.sum()), 0.0)
        shown[np.array(hidden)] = remainder / sum(hidden)
    return shown


def prevalence(groups: dict[str, dict]) -> dict[str, Optional[float]]:
    """positive / (positive + negative) per class; None when either cell is suppressed or both are 0."""
    out = {}
    for name, group in groups.items():
        cls = G.group_class(name)
        if cls is None:
            continue
        pos, neg = group["counts"][0], group["counts"][1]
        out[cls] = None if pos is None or neg is None or pos + neg == 0 else pos / (pos + neg)
    return out


def intensity_quantiles(group: Optional[dict], qs: Sequence[float] = QUANTILES) -> Optional[dict[str, float]]:
    """Quantiles of the pixel intensity on [0, 1] from a 256-level histogram (None without pixels)."""
    counts = cells(group)
    total = int(counts.sum())
    if total == 0:
        return None
    cumulative = np.cumsum(counts)
    return {f"p{int(round(q * 100)):02d}": float(np.searchsorted(cumulative, q * total, side="left")) / 255.0
            for q in qs}


def pooled_prevalence(payloads: Iterable[dict]) -> dict[str, dict]:
    """Per class Σ positive / Σ (positive + negative) over the sites that released both cells
    (a site with one of them suppressed would bias the ratio; it is left out and not listed)."""
    sums: dict[str, list] = {}
    for payload in payloads:
        for name, group in (payload.get("groups") or {}).items():
            cls = G.group_class(name)
            if cls is None:
                continue
            entry = sums.setdefault(cls, [0, 0, []])
            pos, neg = group["counts"][0], group["counts"][1]
            if pos is not None and neg is not None:
                entry[0] += pos
                entry[1] += pos + neg
                entry[2].append(payload.get("site"))
    return {cls: {"value": (pos / total) if total else None, "sites": sites}
            for cls, (pos, total, sites) in sums.items()}


def derived(groups: dict[str, dict]) -> dict[str, Any]:
    return {"prevalence": prevalence(groups), "intensity_quantiles": intensity_quantiles(groups.get("intensity"))}


def with_categories(groups: dict[str, dict]) -> dict[str, dict]:
    """Each group with its category names beside its counts (the readable form in stats.json)."""
    return {name: {"categories": G.categories(name), **group} for name, group in groups.items()}


def global_section(payloads: dict[str, dict], groups: Optional[dict[str, dict]] = None) -> dict[str, Any]:
    """``stats.json`` ``global``: the contributing sites, summed groups, derived values.

    ``groups``: sums taken elsewhere (NVIDIA FLARE's server), used as given; by default the
    payloads are summed here. Prevalence is pooled over the sites that released both of a
    class's cells (:func:`pooled_prevalence`); quantiles come from the summed histogram.
    """
    contributing = [s for s, p in payloads.items() if p.get("groups")]
    if groups is None:
        groups = merge_groups(payloads[s] for s in contributing)
    pooled = pooled_prevalence(payloads[s] for s in contributing)
    return {"sites": contributing, "groups": with_categories(groups),
            "derived": {"prevalence": {c: v["value"] for c, v in pooled.items()},
                        "prevalence_sites": {c: v["sites"] for c, v in pooled.items()},
                        "intensity_quantiles": intensity_quantiles(groups.get("intensity"))}}
