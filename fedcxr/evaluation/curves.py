"""Training curves of a run: per-round training loss and validation AUROC, from ``metrics.jsonl``.

The training side writes one JSON object per round to ``RUN_DIR/metrics.jsonl``
(:func:`fedcxr.rundir.write_metrics`, read back by :func:`fedcxr.rundir.read_metrics`); the keys
read here are (the run driver writes them)::

    round                      0-based round number
    train: {site: {loss}}      each source's mean training loss of the round
    target: {loss}             the target's fine-tuning loss (methods with a labeled target)
    val: {site: {mean_auroc}}  mean validation AUROC of each evaluated site (rounds with validation)

:func:`training_series` turns the rows into plain series (rounds 1-based, as the console counts
them); :func:`fedcxr.evaluation.plots.plot_training_curves` draws them. A missing or
non-finite number leaves a gap rather than a made-up point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from fedcxr.rundir import read_metrics  # noqa: F401  (the curves' reader: a line that is not JSON names it)

#: the label of the target's fine-tuning loss in the curves
TARGET_LABEL = "target (fine-tuning)"

Series = dict[str, list[tuple[int, float]]]


@dataclass
class TrainingSeries:
    """``loss`` and ``val_auroc``: label → ``[(round, value)]`` with rounds counted from 1."""

    rounds: int = 0
    loss: Series = field(default_factory=dict)
    val_auroc: Series = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.loss or self.val_auroc)


def _finite(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _add(series: Series, label: str, r: int, value: Any) -> None:
    number = _finite(value)
    if number is not None:
        series.setdefault(str(label), []).append((r, number))


def training_series(rows: Sequence[Mapping[str, Any]]) -> TrainingSeries:
    """Per-round training losses (each source, and the target's fine-tuning) and mean validation
    AUROCs (each evaluated site) of ``metrics.jsonl`` rows; rows without a round number are skipped."""
    out = TrainingSeries()
    for row in rows:
        try:
            r = int(row["round"]) + 1
        except (KeyError, TypeError, ValueError):
            continue
        out.rounds = max(out.rounds, r)
        for site, entry in (row.get("train") or {}).items():
            if isinstance(entry, Mapping):
                _add(out.loss, site, r, entry.get("loss"))
        target = row.get("target")
        if isinstance(target, Mapping):
            _add(out.loss, TARGET_LABEL, r, target.get("loss"))
        for site, entry in (row.get("val") or {}).items():
            if isinstance(entry, Mapping):
                _add(out.val_auroc, site, r, entry.get("mean_auroc"))
    return out
