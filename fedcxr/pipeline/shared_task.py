"""One binary task shared by every site, each labeling "its" condition (AuxInfo+GP paper, CheXpert).

In the AuxInfo+GP paper's CheXpert setup the domains are conditions — lung lesion, pneumonia,
atelectasis, consolidation as sources, edema as target — and all of them train the SAME output
("positive/negative diagnosis"): a source's positives are the rows positive for its own
condition. The config says so with ``task:``::

    task:
      output: edema                 # the one output (a canonical class: the head's row is named by it)
      site_labels: {lung_lesion: lung_lesion, pneumonia: pneumonia, ..., edema: edema}
      balance: true                 # as many negatives as positives per site and split
      negatives: zero               # zero (the paper's text) | unmentioned (the authors' code)

Each site, on its own machine, copies its condition's column onto ``label__<output>``, clears
every other label column, and (``balance``) keeps all its positives and as many negatives,
drawn in a stable pseudo-random patient order (the paper: "randomly sampled"); the rows left
out move to split ``unused``, so the decoded-image cache (row order = manifest order) stays valid.

Negatives: the paper's text says it samples "the ones with labels 0 for that condition instead
of No Finding"; the authors' preprocessing (``chexpert_meta_data_preprocess.py``) takes rows
whose value is neither 0 nor ±1, i.e. the condition is not mentioned. ``zero`` is the default:
a 0 is a reported absence, while an unmentioned condition is unknown (CheXpert leaves it blank
when the report does not speak of it), so ``unmentioned`` mixes unlabeled positives into the
negatives; ``unmentioned`` reproduces the code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Mapping, Optional

import numpy as np
import pandas as pd

from fedcxr.pipeline.data import SiteInfo
from fedcxr.site_adapters.manifest import patient_bucket
from fedcxr.vocab import CLASSES, label_column, raw_column

UNUSED_SPLIT = "unused"
NEGATIVES = ("zero", "unmentioned")


@dataclass(frozen=True)
class SiteLabel:
    """One site's part of a ``task:`` spec: its own condition ``label`` mapped onto ``output``."""

    output: str
    label: str
    balance: bool = True
    negatives: Literal["zero", "unmentioned"] = "zero"


def site_task(spec: Optional[Mapping], site: str) -> Optional[SiteLabel]:
    """This site's part of a ``task:`` spec (the config's ``task`` block as the runner settings carry
    it: :class:`~fedcxr.pipeline.config.SharedTaskConfig`'s fields); None: no shared task."""
    if not spec:
        return None
    labels = spec.get("site_labels") or {}
    if site not in labels:
        raise ValueError(f"task.site_labels has no entry for site {site!r}")
    negatives = spec.get("negatives", "zero")
    if negatives not in NEGATIVES:
        raise ValueError(f"task.negatives must be one of {NEGATIVES}, got {str(negatives)[:40]!r}")
    return SiteLabel(output=str(spec["output"]), label=str(labels[site]), balance=bool(spec.get("balance", True)),
                     negatives=negatives)


def apply_shared_task(site: SiteInfo, task: Optional[SiteLabel]) -> SiteInfo:
    """The site with its own condition mapped onto the shared output (see the module docstring)."""
    if not task:
        return site
    frame = site.manifest.copy()
    own, output = task.label, task.output
    source = label_column(own)
    if source not in frame:
        raise ValueError(f"site {site.name}: task.site_labels names {own!r}, which this site does not label "
                         f"(it labels {site.class_set})")
    mapped = frame[source].astype(float)
    raw = frame[raw_column(own)] if raw_column(own) in frame else frame[source]
    for cls in CLASSES:
        if label_column(cls) in frame:
            frame[label_column(cls)] = np.nan
    if task.balance:
        negative = (raw == 0) if task.negatives == "zero" else raw.isna()
        keep = _balanced(frame, mapped == 1, negative.to_numpy(dtype=bool))
        mapped = pd.Series(np.where(mapped == 1, 1.0, np.where(negative, 0.0, np.nan)), index=frame.index)
        frame.loc[~keep, "split"] = UNUSED_SPLIT
        mapped[~keep] = np.nan
    frame[label_column(output)] = mapped
    return replace(site, manifest=frame, class_set=[output])


def _balanced(frame: pd.DataFrame, positive: pd.Series, negative: np.ndarray) -> np.ndarray:
    """Per split: every positive row, and as many negatives in a stable patient-hash order."""
    positive = positive.to_numpy(dtype=bool)
    keep = positive.copy()
    order = patient_bucket(frame["patient_id"], salt="fedcxr-balance")
    for split in frame["split"].unique():
        in_split = (frame["split"] == split).to_numpy()
        candidates = np.flatnonzero(in_split & negative & ~positive)
        chosen = candidates[np.argsort(order[candidates], kind="stable")][: int((in_split & positive).sum())]
        keep[chosen] = True
    return keep
