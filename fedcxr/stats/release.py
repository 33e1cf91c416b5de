"""What leaves a site: its counts after optional Laplace noise and min-count suppression.

:func:`release` turns a site's true counts (:class:`fedcxr.stats.site.SiteCounts`) into the
**payload**, the only thing the in-process merge or the FLARE server ever receives. Its rules:

1. **Laplace noise (optional, budget ε).** Each group is a histogram: adding or removing one
   image changes one cell of a row group by 1 (L1 sensitivity 1) and at most
   ``image_size²`` pixel counts of ``intensity`` (L1 sensitivity ``image_size²``). One image
   touches every group once, so the site's ε is split evenly over its G groups
   (sequential composition): each cell of group g gets ``Lap(sensitivity_g · G / ε)`` noise,
   is rounded and clipped at 0 (post-processing, free). The whole payload is then ε-DP for
   one image (add/remove). The noise comes from the operating system's entropy, never a seed
   another party could know.
2. **Primary suppression.** A cell below K (``--min-count``, default 5) is ``null``. The
   choice of 5 follows common small-cell rules for health statistics (publication rules of
   national statistics offices use 5–11; NVIDIA FLARE's example jobs use a min count of 10
   for the whole feature); a consortium raises it, never lowers it below 1.
3. **Secondary (complementary) suppression.** Each group's total (``count``) is sent, and a
   site's row groups all share one total (its row count), so a hidden cell could be worked out
   from the total and the cells shown. Each group is protected by :func:`fedcxr.stats.suppression.protect`
   (more cells hidden until every hidden non-zero cell has more than one possible value, for an
   attacker who knows this rule), then the groups that count the same rows two ways (the age/sex
   pyramid and its margins, the acquisition groups, ``split`` and ``train_labels``) are audited
   together by :func:`fedcxr.stats.linked.audit`.
4. **Small groups and small sites.** A group whose total is below K sends only nulls; a site
   whose (noisy) row count is below K sends nothing but its status, and so does a site where
   even hiding every cell of a group would leave one exact (every cell of a group at K − 1, or
   a linked cell that no further suppression frees: :data:`UNPROTECTABLE`).

Suppression is decided on the noisy values when ε is set (deciding on the true ones would
leak through the decision). Every count in a payload sits under a key ``count`` or
``counts``; :func:`check_payload` refuses a payload holding a number below K there — the
last gate before anything is sent.
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Optional

import numpy as np

from fedcxr.errors import UserError
from fedcxr.stats import groups as G
from fedcxr.stats.linked import Unprotectable, audit
from fedcxr.stats.site import SiteCounts
from fedcxr.stats.suppression import STUCK, protect

DEFAULT_MIN_COUNT = 5
PAYLOAD_VERSION = 1
#: the public reason of a site whose counts cannot be released without an exact small count
UNPROTECTABLE = "too few rows to release any count without a small one being recoverable: nothing but this status is sent"


def check_privacy_options(min_count: int, epsilon: Optional[float]) -> None:
    if not isinstance(min_count, int) or min_count < 1:
        raise UserError(f"--min-count must be an integer ≥ 1 (a count below it never leaves a site), got {min_count!r}")
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        raise UserError(f"--epsilon must be a positive number (the Laplace budget per site), got {epsilon!r}")


def sensitivity(name: str, image_size: int) -> int:
    """L1 change of group ``name`` when one image is added or removed."""
    return int(image_size) ** 2 if name == "intensity" else 1


def noise_scales(names: list[str], image_size: int, epsilon: Optional[float]) -> dict[str, Optional[float]]:
    """Laplace scale per group: ``sensitivity · G / ε`` (None without noise)."""
    if epsilon is None:
        return {name: None for name in names}
    return {name: sensitivity(name, image_size) * len(names) / float(epsilon) for name in names}


def suppress(cells: np.ndarray, min_count: int) -> list[Optional[int]]:
    """One group's cells after primary and secondary suppression (``None`` = hidden), on its own
    (:func:`fedcxr.stats.suppression.protect`; :func:`release` also audits linked groups)."""
    hidden, _ = protect(cells, min_count)
    return [None if h else int(v) for v, h in zip(np.asarray(cells, dtype=np.int64), hidden)]


def release_group(cells: np.ndarray, min_count: int) -> dict[str, Any]:
    """One group as a payload sends it, ``{"count": total or None, "counts": [...]}`` — on its own,
    as :func:`release` treats a group that is linked to no other."""
    hidden, total = protect(cells, min_count)
    values = np.asarray(cells, dtype=np.int64)
    return {"count": int(values.sum()) if total is True else None,
            "counts": [None if h else int(v) for v, h in zip(values, hidden)]}


def release(counts: SiteCounts, *, min_count: int = DEFAULT_MIN_COUNT, epsilon: Optional[float] = None,
            rng: Optional[np.random.Generator] = None) -> dict[str, Any]:
    """The site's payload: noisy (optional), suppressed counts per group, and its status.

    ``rng`` is for tests only; by default the noise is drawn from a generator seeded by the
    operating system's entropy (:mod:`secrets`).
    """
    check_privacy_options(min_count, epsilon)
    names = [n for n in G.all_groups(counts.class_set) if n in counts.groups]
    scales = noise_scales(names, counts.image_size, epsilon)
    if epsilon is not None and rng is None:
        rng = np.random.default_rng(secrets.randbits(128))
    noisy = {name: _noisy(counts.groups[name], scales[name], rng) for name in names}
    rows = int(noisy["split"].sum()) if "split" in noisy else 0
    payload: dict[str, Any] = {
        "version": PAYLOAD_VERSION, "site": counts.site,
        "privacy": {"min_count": int(min_count), "epsilon": epsilon,
                    "epsilon_per_group": (float(epsilon) / len(names)) if epsilon is not None and names else None,
                    "mechanism": "laplace" if epsilon is not None else "none"},
        "image_size": counts.image_size, "unavailable": dict(counts.unavailable), "groups": {},
    }
    if rows < min_count:
        return _withheld(payload, f"fewer than {min_count} rows: nothing but this status is sent")
    decided = {name: protect(noisy[name], min_count) for name in names}
    hidden = {name: h for name, (h, _) in decided.items()}
    totals = {name: t for name, (_, t) in decided.items()}
    if any(t == STUCK for t in totals.values()):  # its row count is known from the site's other groups
        return _withheld(payload, UNPROTECTABLE)
    if epsilon is None:  # with noise the links between groups no longer hold exactly; Laplace protects them
        try:
            hidden = audit({n: noisy[n].tolist() for n in names}, hidden, totals, min_count, rows)
        except Unprotectable:
            return _withheld(payload, UNPROTECTABLE)
    suppressed = 0
    for name in names:
        cells = noisy[name]
        shown = [None if h else int(v) for v, h in zip(cells, hidden[name])]
        suppressed += sum(v is None for v in shown)
        payload["groups"][name] = {"count": int(cells.sum()) if totals[name] is True else None, "counts": shown}
    payload["status"] = "partial" if counts.unavailable else "ok"
    total_cells = sum(len(noisy[n]) for n in names)
    if suppressed == total_cells:
        text = f"every cell below {min_count} or beside one: only group totals were sent"
    else:
        text = f"{suppressed} of {total_cells} cells suppressed (below {min_count} or beside one)"
    payload["message"] = text + (f"; unavailable: {', '.join(sorted(counts.unavailable))}" if counts.unavailable else "")
    return payload


def _withheld(payload: dict[str, Any], reason: str) -> dict[str, Any]:
    payload["status"] = "suppressed"
    payload["message"] = reason
    return payload


def failed_payload(site: str, reason: str, *, min_count: int, epsilon: Optional[float]) -> dict[str, Any]:
    """What a site that cannot count sends: its status and a reason naming a kind of problem."""
    return {"version": PAYLOAD_VERSION, "site": site, "status": "failed", "message": reason,
            "privacy": {"min_count": int(min_count), "epsilon": epsilon, "epsilon_per_group": None,
                        "mechanism": "laplace" if epsilon is not None else "none"},
            "image_size": None, "unavailable": {}, "groups": {}}


def _noisy(cells: np.ndarray, scale: Optional[float], rng) -> np.ndarray:
    values = np.asarray(cells, dtype=np.int64)
    if scale is None:
        return values
    noise = rng.laplace(0.0, scale, size=values.shape)
    return np.maximum(np.rint(values + noise), 0).astype(np.int64)


def check_payload(payload: Any, min_count: int, *, where: str = "payload") -> None:
    """Raise ``ValueError`` when any number under a ``count``/``counts`` key is below ``min_count``.

    Walks the whole structure, so a count added anywhere later is checked too.
    """
    def walk(node: Any, path: str, counted: bool) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}", counted or key in ("count", "counts"))
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]", counted)
        elif counted and node is not None:
            if isinstance(node, bool) or not isinstance(node, (int, np.integer)) or node < min_count:
                raise ValueError(f"{where}: {path} = {node!r} may not leave the site (counts are integers ≥ "
                                 f"{min_count} or null)")
    walk(payload, where, False)
