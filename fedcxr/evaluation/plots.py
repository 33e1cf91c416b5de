"""ROC curves, reliability diagrams and training curves (matplotlib, Agg backend: headless servers and CI).

ROC: one figure per evaluated site, every class with a defined AUROC as one curve (AUROC in the
legend, sorted best first), the chance diagonal, and the undefined classes named under the
plot so a missing curve is never silently missing.

Reliability: one figure per evaluated site; top panel the observed positive fraction against
the mean predicted probability in 10 equal-width bins (:mod:`fedcxr.evaluation.calibration`),
one thin line per class and a bold line for all classes pooled, the diagonal = perfect
calibration; bottom panel how many (row, class) entries fall in each bin (pooled).

Text is drawn without mathtext (a `$` in a name is a dollar sign: :func:`_plain_text`).

Training curves: the per-round training losses and validation AUROCs of ``metrics.jsonl``
(:mod:`fedcxr.evaluation.curves`), two panels sharing the round axis.

Figure sizes are fixed (pixels = inches × dpi), so reports lay out the same every time:
:func:`figure_size` gives them. Margins are fixed too (``subplots_adjust``, the legend's room
included), not computed by ``tight_layout``: that draws every figure twice, and a report writes
two figures per evaluated site (measured: 0.84 s instead of 1.55 s for a site's pair).
"""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from sklearn.metrics import roc_curve  # noqa: E402

from fedcxr.atomic import atomic_write_bytes  # noqa: E402

_STYLES = ["-", "--", "-.", ":"]
DPI = 120
#: Above this many curves the legend moves out of the axes and the figure widens.
MAX_INSIDE_LEGEND = 8


def figure_size(kind: str, n_curves: int) -> tuple[int, int]:
    """(width, height) in pixels of a ``"roc"``, ``"reliability"`` or ``"curves"`` (training curves, legend
    outside the axes) figure with ``n_curves`` classes or sites."""
    inches = {"roc": (7.5, 6.0), "reliability": (7.5, 7.0), "curves": (9.0, 6.0)}[kind]
    width = 9.5 if n_curves > MAX_INSIDE_LEGEND and kind != "curves" else inches[0]
    return int(round(width * DPI)), int(round(inches[1] * DPI))


def _figsize(kind: str, n_curves: int) -> tuple[float, float]:
    width, height = figure_size(kind, n_curves)
    return width / DPI, height / DPI


def _style(i: int, cmap) -> str:
    """tab20 pairs a dark and a light shade: dash the light one so neighbours stay apart."""
    return _STYLES[(i // cmap.N) % len(_STYLES)] if cmap.N == 10 else ("-" if i % 2 == 0 else "--")


def _plain_text(func):
    """Draw with matplotlib's mathtext off: a ``$`` in a site or method name (run directories and
    sites' replies are hostile input) is a dollar sign, never a formula that fails to parse half-way
    through a report (SECURITY.md, "Reports")."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with plt.rc_context({"text.parse_math": False}):
            return func(*args, **kwargs)
    return wrapper


def _save(fig, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)


@_plain_text
def plot_roc(
    frame: pd.DataFrame,
    classes: Sequence[str],
    path: Path,
    *,
    title: str,
    aurocs: Optional[Mapping[str, float]] = None,
) -> Path:
    """Write ROC curves of ``classes`` (``label__<c>`` vs ``prob__<c>`` of ``frame``) to ``path``.

    ``aurocs``: class → AUROC for the legend (computed here when not given); a class whose
    AUROC is NaN gets no curve and is listed as undefined.
    """
    from fedcxr.evaluation.metrics import auroc

    curves, undefined = [], []
    for cls in classes:
        y = frame[f"label__{cls}"].to_numpy(dtype=float, na_value=np.nan)
        p = frame[f"prob__{cls}"].to_numpy(dtype=float)
        value = aurocs.get(cls, np.nan) if aurocs is not None else auroc(y, p)
        if value is None or not np.isfinite(value):
            undefined.append(cls)
            continue
        keep = ~np.isnan(y)
        fpr, tpr, _ = roc_curve(y[keep], p[keep])
        curves.append((value, cls, fpr, tpr))
    curves.sort(key=lambda c: -c[0])

    many = len(curves) > MAX_INSIDE_LEGEND
    fig, ax = plt.subplots(figsize=_figsize("roc", len(curves)), dpi=DPI)
    cmap = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
    for i, (value, cls, fpr, tpr) in enumerate(curves):
        ax.plot(fpr, tpr, lw=1.6, color=cmap(i % cmap.N), linestyle=_style(i, cmap), label=f"{cls} ({value:.3f})")
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, linestyle="--", label="chance (0.500)")
    ax.set(xlim=(0, 1), ylim=(0, 1.005), xlabel="False positive rate (1 − specificity)",
           ylabel="True positive rate (sensitivity)", title=title)
    ax.set_aspect("equal")
    ax.grid(alpha=0.3)
    if many:
        ax.legend(title="class (AUROC)", loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8,
                  title_fontsize=9, frameon=False)
    else:
        ax.legend(title="class (AUROC)", loc="lower right", fontsize=8, title_fontsize=9)
    if undefined:
        fig.text(0.01, 0.01, "AUROC undefined (one label value): " + ", ".join(undefined),
                 fontsize=8, color="0.3", ha="left", va="bottom", wrap=True)
    fig.subplots_adjust(left=0.1, right=0.72 if many else 0.97, top=0.93, bottom=0.14 if undefined else 0.1)
    return _save(fig, path)


@_plain_text
def plot_reliability(
    frame: pd.DataFrame,
    classes: Sequence[str],
    path: Path,
    *,
    title: str,
    n_bins: int = 10,
) -> Path:
    """Write the reliability diagram of ``classes`` (``label__<c>`` vs ``prob__<c>``) to ``path``.

    Bins with no rows are left out of a line (not drawn at 0); classes with no labeled rows
    get no line and are named under the plot.
    """
    from fedcxr.evaluation.calibration import reliability_bins

    lines, undefined, ys, ps = [], [], [], []
    for cls in classes:
        y = frame[f"label__{cls}"].to_numpy(dtype=float, na_value=np.nan)
        p = frame[f"prob__{cls}"].to_numpy(dtype=float, na_value=np.nan)
        keep = ~np.isnan(y)
        if not keep.any():
            undefined.append(cls)
            continue
        lines.append((cls, reliability_bins(y[keep], p[keep], n_bins)))
        ys.append(y[keep])
        ps.append(p[keep])
    pooled = reliability_bins(np.concatenate(ys) if ys else np.empty(0),
                              np.concatenate(ps) if ps else np.empty(0), n_bins)

    many = len(lines) > MAX_INSIDE_LEGEND
    fig, (ax, hist) = plt.subplots(2, 1, figsize=_figsize("reliability", len(lines)), dpi=DPI, sharex=True,
                                   gridspec_kw={"height_ratios": [3, 1]})
    cmap = plt.get_cmap("tab10" if len(lines) <= 10 else "tab20")
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, linestyle="--", label="perfectly calibrated")
    for i, (cls, bins) in enumerate(lines):
        filled = bins.count > 0
        ax.plot(bins.mean_predicted[filled], bins.observed[filled], lw=1.0, marker="o", markersize=3,
                color=cmap(i % cmap.N), linestyle=_style(i, cmap), alpha=0.8, label=cls)
    filled = pooled.count > 0
    if filled.any():
        ax.plot(pooled.mean_predicted[filled], pooled.observed[filled], lw=2.6, marker="s", markersize=5,
                color="black", label="all classes pooled")
    ax.set(xlim=(0, 1), ylim=(0, 1.005), ylabel="Observed fraction positive", title=title)
    ax.grid(alpha=0.3)
    legend = dict(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False) if many else dict(loc="upper left")
    ax.legend(title="class", fontsize=8, title_fontsize=9, **legend)
    width = 1.0 / n_bins
    hist.bar(pooled.edges[:-1], pooled.count, width=width, align="edge", color="0.55", edgecolor="white")
    hist.set(xlim=(0, 1), xlabel=f"Mean predicted probability ({n_bins} equal-width bins)",
             ylabel="entries")
    hist.grid(alpha=0.3, axis="y")
    if undefined:
        fig.text(0.01, 0.01, "no labeled rows: " + ", ".join(undefined),
                 fontsize=8, color="0.3", ha="left", va="bottom", wrap=True)
    fig.subplots_adjust(left=0.1, right=0.75 if many else 0.97, top=0.94, bottom=0.12 if undefined else 0.08,
                        hspace=0.08)
    return _save(fig, path)


def _legend_text(label: str) -> str:
    """A name as matplotlib shows it literally: ``$`` would start mathtext, a leading ``_`` hides the entry."""
    text = str(label).replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def plot_training_curves(series, path: Path, *, title: str) -> Path:
    """Write the training curves of a run (:class:`fedcxr.evaluation.curves.TrainingSeries`) to ``path``.

    Top: each training loss per round (sources, and the target's fine-tuning); bottom: each
    evaluated site's mean validation AUROC per round (0–1, chance dashed). A panel without data
    says so instead of staying blank. Fixed size (:func:`figure_size` ``"curves"``) and fixed
    margins (no tight layout: one draw, not two).
    """
    width, height = figure_size("curves", max(len(series.loss), len(series.val_auroc)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width / DPI, height / DPI), dpi=DPI, sharex=True)
    cmap = plt.get_cmap("tab10")
    for ax, data, ylabel in ((top, series.loss, "training loss"), (bottom, series.val_auroc, "validation mean AUROC")):
        for i, (label, points) in enumerate(data.items()):
            rounds, values = zip(*points)
            ax.plot(rounds, values, marker="o", markersize=3, lw=1.4, color=cmap(i % cmap.N),
                    linestyle=_STYLES[(i // cmap.N) % len(_STYLES)], label=_legend_text(label))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if data:
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        else:
            ax.text(0.5, 0.5, "not recorded" + (" (no validation round: eval_every 0?)" if ax is bottom else ""),
                    transform=ax.transAxes, ha="center", va="center", color="0.4")
    bottom.axhline(0.5, color="0.6", lw=1, linestyle="--")
    bottom.set_ylim(0, 1.005)
    bottom.set_xlabel("round")
    bottom.set_xlim(0.5, max(series.rounds, 1) + 0.5)
    bottom.xaxis.get_major_locator().set_params(integer=True)
    top.set_title(title)
    fig.subplots_adjust(left=0.1, right=0.72, top=0.93, bottom=0.09, hspace=0.08)
    return _save(fig, path)
