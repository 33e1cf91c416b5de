"""Figures a clinician reads at a glance (matplotlib, Agg backend), from released counts only.

* ``prevalence.png`` — per class, each site's prevalence as a bar (the classes most often
  labeled across the federation; a suppressed prevalence is drawn as a hatched gap, never 0);
* ``pyramids.png`` — per site an age/sex pyramid (women left, men right, share of the site's
  rows with both known);
* ``intensity.png`` — each site's pixel-intensity distribution and the global one;
* ``distances.png`` — site × site heatmaps of the three distances of the shift diagnosis.

Every figure is drawn with matplotlib's mathtext parsing off (``text.parse_math``), so a
``$`` in a site name is printed as it is, never read as a formula; :func:`plain` also drops
control characters and bounds the length of every name drawn.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
import numpy as np  # noqa: E402

from fedcxr.atomic import atomic_write_bytes  # noqa: E402
from fedcxr.stats import groups as G  # noqa: E402
from fedcxr.stats.merge import cells  # noqa: E402

DPI = 110
MAX_CLASSES = 14
COLORS = plt.get_cmap("tab10")


def plain(text: Any) -> str:
    """A name as drawn: printable characters only, at most 60 (mathtext is off for every figure)."""
    return "".join(ch for ch in str(text) if ch.isprintable())[:60]


#: the figures ``fedcxr stats`` may draw (``<name>.png``), in the order of the report
FIGURES = ("prevalence", "pyramids", "intensity", "distances")


def write_figures(out: Path, stats: dict) -> dict[str, Path]:
    """Every figure that has something to show; name → path."""
    out = Path(out)
    sites = {name: entry for name, entry in stats["sites"].items() if entry.get("groups")}
    made = {}
    for name, fn in zip(FIGURES, (_prevalence, _pyramids, _intensity, _distances)):
        with plt.rc_context({"text.parse_math": False}):
            fig = fn(sites, stats)
            if fig is not None:
                made[name] = _save(fig, out / f"{name}.png")
    return made


def _save(fig, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def _prevalence(sites: dict, stats: dict):
    labeled = {}
    for name, group in stats["global"]["groups"].items():
        cls = G.group_class(name)
        if cls is not None:
            labeled[cls] = int(cells(group)[:2].sum())
    classes = [c for c in sorted(labeled, key=lambda c: -labeled[c]) if labeled[c] > 0][:MAX_CLASSES]
    if not classes:
        return None
    names = list(sites)
    height = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(classes) * max(1.0, len(names) / 3) + 1.5))
    y = np.arange(len(classes))
    for i, site in enumerate(names):
        prev = sites[site]["derived"]["prevalence"]
        for j, cls in enumerate(classes):
            value = prev.get(cls)
            pos = y[j] + (i - (len(names) - 1) / 2) * height
            if value is None:
                labeled_here = G.label_group(cls) in sites[site]["groups"]
                if labeled_here:  # labeled but suppressed: a hatched gap, never a 0 bar
                    ax.barh(pos, 1.0, height=height, color="none", edgecolor=COLORS(i % 10), hatch="///",
                            linewidth=0.0, alpha=0.35)
                continue
            ax.barh(pos, value, height=height, color=COLORS(i % 10))
    handles = []
    for i, site in enumerate(names):
        none = all(sites[site]["derived"]["prevalence"].get(c) is None for c in classes)
        handles.append(Patch(color=COLORS(i % 10), label=_name(site, stats) + (" (none released)" if none else "")))
    handles.append(Patch(facecolor="none", edgecolor="grey", hatch="///", label="labeled, not released"))
    ax.set_yticks(y, [plain(c.replace("_", " ")) for c in classes])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("prevalence = positive / (positive + negative)")
    ax.set_title(f"Label prevalence per site (a count below {stats['min_count']} is never released)")
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _pyramids(sites: dict, stats: dict):
    ready = {s: e for s, e in sites.items() if G.PYRAMID in e["groups"]}
    if not ready:
        return None
    bins = G.age_bins()
    n = len(ready) + 1
    cols = min(n, 3)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False)
    panels = list(ready.items()) + [("all sites", stats["global"])]
    for ax, (name, entry) in zip(axes.ravel(), panels):
        group = entry["groups"].get(G.PYRAMID) or {}
        counts = cells(group)[:-1].astype(float)
        hidden = [v is None for v in (group.get("counts") or [None] * (2 * len(bins) + 1))[:-1]]
        total = counts.sum()
        women, men = counts[:len(bins)], counts[len(bins):]
        y = np.arange(len(bins))
        if total > 0:
            ax.barh(y, -women / total * 100, color="#c0504d", label="F")
            ax.barh(y, men / total * 100, color="#4f81bd", label="M")
        limit = max(10.0, float(np.max(np.concatenate([women, men])) / total * 100) if total > 0 else 10.0)
        ax.set_xlim(-limit * 1.1, limit * 1.1)
        ax.set_yticks(y, bins)
        for k, gone in enumerate(hidden):  # a suppressed cell: said, never drawn as a bar
            if gone:
                side = -1 if k < len(bins) else 1
                ax.text(side * limit * 0.05, k % len(bins), "not released", color="grey", fontsize=6,
                        va="center", ha="right" if side < 0 else "left")
        ax.axvline(0, color="black", linewidth=0.6)
        ticks = ax.get_xticks()
        ax.set_xticks(ticks, [f"{abs(t):.0f}" for t in ticks])
        known = int(total)
        ax.set_title(f"{_name(name, stats)} (n = {known} released)" if total > 0 else
                     f"{_name(name, stats)}: no sex × age released", fontsize=9)
        ax.set_xlabel("% of rows   (F left, M right)", fontsize=8)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"Age / sex pyramids: share of the rows released with sex and age (a cell below "
                 f"{stats['min_count']} is not released)", fontsize=11)
    fig.tight_layout()
    return fig


def _intensity(sites: dict, stats: dict):
    lines = [(name, cells(entry["groups"].get("intensity"))) for name, entry in sites.items()]
    lines = [(n, c) for n, c in lines if c.sum() > 0]
    if not lines:
        return None
    levels = np.arange(G.INTENSITY_LEVELS) / 255.0
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, (name, counts) in enumerate(lines):
        ax.plot(levels, counts / counts.sum() * 100, color=COLORS(i % 10), label=_name(name, stats), linewidth=1.2)
    total = cells(stats["global"]["groups"].get("intensity"))
    if total.sum() > 0:
        ax.plot(levels, total / total.sum() * 100, color="black", linestyle="--", linewidth=1.4, label="all sites")
    ax.set_xlabel("pixel intensity (decoded, scaled to [0, 1]; 0 = black)")
    ax.set_ylabel("% of pixels")
    ax.set_title("Pixel-intensity distribution per site (the decoded images training sees)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def _distances(sites: dict, stats: dict):
    dist = stats["shift"]["distances"]
    names = dist["sites"]
    if len(names) < 2:
        return None
    kinds = [("labels", "label prevalence (JS)"), ("demographics", "demographics (JS)"),
             ("intensity", "pixel intensity (W1)")]
    fig, axes = plt.subplots(1, 3, figsize=(4.3 * 3, 3.4 + 0.12 * len(names)), layout="constrained")
    for ax, (kind, title) in zip(axes, kinds):
        matrix = np.array([[np.nan if v is None else v for v in row] for row in dist[kind]["matrix"]], dtype=float)
        top = np.nanmax(matrix) if np.isfinite(matrix).any() else 1.0
        ax.set_facecolor("#e6e6e6")  # a pair with nothing to compare stays grey, marked n/a
        image = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis", vmin=0, vmax=max(top, 1e-6))
        labels = [_name(n, stats) for n in names]
        ax.set_xticks(range(len(names)), labels, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(names)), labels, fontsize=8)
        for i in range(len(names)):
            for j in range(len(names)):
                value = matrix[i, j]
                text = "n/a" if not np.isfinite(value) else f"{value:.2f}" if kind != "intensity" else f"{value:.3f}"
                bright = not np.isfinite(value) or value > 0.6 * max(top, 1e-6)
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="black" if bright else "white")
        ax.set_title(title, fontsize=10)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle("How different are the sites? (0 = identical; n/a = nothing released to compare)", fontsize=11)
    return fig


def _name(site: str, stats: dict) -> str:
    """A site's name as drawn, the target marked."""
    return plain(site) + (" (target)" if site == stats.get("target") else "")
