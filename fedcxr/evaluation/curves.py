"""Training curves of a run: per-round training loss and validation AUROC, from ``metrics.jsonl``.

The training side appends one JSON object per round to ``RUN_DIR/metrics.jsonl``; the keys
read here are (:mod:`fedcxr.pipeline.federation` writes them)::

    round                      0-based round number
    train: {site: {loss}}      each source's mean training loss of the round
    target: {loss}             the target's fine-tuning loss (methods with a labeled target)
    val: {site: {mean_auroc}}  mean validation AUROC of each evaluated site (rounds with validation)

:func:`training_series` turns the rows into plain series (rounds 1-based, as the console counts
them); :func:`fedcxr.evaluation.plots.plot_training_curves` draws them. A missing or
non-finite number leaves a gap rather than a made-up point.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedcxr.errors import UserError

METRICS_FILE = "metrics.jsonl"
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


def read_metrics(run_dir: Path | str) -> list[dict[str, Any]]:
    """The rows of ``RUN_DIR/metrics.jsonl`` ([] when absent); a line that is not a JSON object is a
    :class:`UserError` naming the file and line."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise UserError(f"{path}: line {number} is not valid JSON ({exc.__class__.__name__})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}: line {number} is not a JSON object")
        rows.append(row)
    return rows


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
