"""ROC curve figures (matplotlib, Agg backend: works on headless servers and in CI).

One figure per evaluated site, every class with a defined AUROC as one curve (AUROC in the
legend, sorted best first), the chance diagonal, and the undefined classes named under the
plot so a missing curve is never silently missing.
"""

from __future__ import annotations

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

    many = len(curves) > 8
    fig, ax = plt.subplots(figsize=(9.5, 6.0) if many else (7.5, 6.0), dpi=120)
    cmap = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
    for i, (value, cls, fpr, tpr) in enumerate(curves):
        # tab20 pairs a dark and a light shade: dash the light one so neighbours stay apart
        style = _STYLES[(i // cmap.N) % len(_STYLES)] if cmap.N == 10 else ("-" if i % 2 == 0 else "--")
        ax.plot(fpr, tpr, lw=1.6, color=cmap(i % cmap.N), linestyle=style, label=f"{cls} ({value:.3f})")
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
    fig.tight_layout(rect=(0, 0.04 if undefined else 0, 1, 1))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)
