"""Which labeled training rows a site trains on: the cap, the draw, and a held-out fold.

Three settings of ``target_train`` decide them, each applied at the site (the rows never leave it):

* ``labeled`` — the cap: a count of rows or a fraction of the training rows;
* ``label_draw`` — which rows the cap keeps. Rows are ordered by a hash of their patient id and
  the first ones kept, so a cap keeps whole patients (all of a patient's labeled rows are
  consecutive; only the last patient at the cut can lose rows to the cap). ``null`` orders by the
  salt ``fedcxr-labeled`` — the one draw every fedcxr version before this knob made, so old
  configs train on the same rows and keep their fingerprint. An integer ``k`` orders by the salt
  ``fedcxr-labeled:draw<k>``: a fresh, reproducible draw of the same size (a benchmark sets
  ``label_draw = seed`` so each seed draws its own labeled rows; the test split, fixed at
  ingest, never changes);
* ``holdout`` (``folds``, ``fold``) — cross-fitting within the budget (:mod:`fedcxr.workflows.choose`):
  the kept rows' patients are dealt into ``folds`` folds, and fold ``fold`` is held out of
  training, to score the model on rows it never saw without spending a single label more.

Why the draw is a knob and not the seed: a run that resumes checks the config's fingerprint, and
the rows a target trains on must not change under it; ``label_draw: null`` keeps every earlier
run's rows and fingerprint, while a new benchmark states its draw in its config.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fedcxr.site_adapters.manifest import patient_bucket

#: The salt of the one fixed draw (``label_draw: null``): the order every earlier version used.
LABELED_SALT = "fedcxr-labeled"
FOLD_SALT = "fedcxr-holdout"


def draw_salt(draw: Optional[int]) -> str:
    """The patient-hash salt of draw ``draw`` (``None``: the fixed draw of earlier versions)."""
    return LABELED_SALT if draw is None else f"{LABELED_SALT}:draw{int(draw)}"


def row_cap(labeled, n_rows: int) -> Optional[int]:
    """The number of rows ``labeled`` allows out of ``n_rows`` training rows (``None``: no cap)."""
    if labeled is None:
        return None
    count = int(round(labeled * n_rows)) if isinstance(labeled, float) and labeled <= 1 else int(labeled)
    return max(1, count)


def select_labeled(frame: pd.DataFrame, label_cols: Sequence[str], labeled=None,
                   draw: Optional[int] = None) -> np.ndarray:
    """Positions (sorted) of the rows of ``frame`` with a label in ``label_cols``, capped by ``labeled``
    in the patient-hash order of draw ``draw``."""
    cols = [c for c in label_cols if c in frame]
    has_label = frame[cols].notna().any(axis=1).to_numpy() if cols else np.zeros(len(frame), bool)
    rows = np.flatnonzero(has_label)
    limit = row_cap(labeled, len(frame))
    if limit is None or len(rows) == 0:
        return rows
    order = np.argsort(patient_bucket(frame["patient_id"].iloc[rows], salt=draw_salt(draw)), kind="stable")
    return np.sort(rows[order][:limit])


def patient_folds(frame: pd.DataFrame, rows: np.ndarray, label_cols: Sequence[str], folds: int,
                  draw: Optional[int] = None) -> np.ndarray:
    """The fold (0..folds-1) of each of ``rows``: whole patients dealt in turn, stratified by label.

    Patients are sorted by whether any of their rows is positive for any class, then by a hash of
    the patient id (salted with the draw), and dealt round-robin, so every fold gets its share of
    positive and of negative patients — with 10 labels and 3 folds each fold still holds both
    classes where the rows do, and the pooled out-of-fold AUROC is defined."""
    if folds < 2:
        raise ValueError(f"holdout: at least 2 folds, got {folds}")
    sub = frame.iloc[rows]
    cols = [c for c in label_cols if c in sub]
    positive = (sub[cols].fillna(0).to_numpy() > 0).any(axis=1) if cols else np.zeros(len(sub), bool)
    patients = sub["patient_id"].astype(str).to_numpy()
    per_patient = pd.Series(positive).groupby(patients).any()
    order = pd.DataFrame({"positive": per_patient.to_numpy(),
                          "hash": patient_bucket(pd.Series(per_patient.index), salt=f"{FOLD_SALT}:{draw_salt(draw)}")},
                         index=per_patient.index).sort_values(["positive", "hash"], kind="stable")
    fold_of = {pid: i % folds for i, pid in enumerate(order.index)}
    return np.array([fold_of[p] for p in patients], dtype=int)


def split_holdout(frame: pd.DataFrame, rows: np.ndarray, label_cols: Sequence[str], folds: int, fold: int,
                  draw: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` split into (kept for training, held out): fold ``fold`` of :func:`patient_folds` held out."""
    if not 0 <= fold < folds:
        raise ValueError(f"holdout: fold {fold} is not one of 0..{folds - 1}")
    which = patient_folds(frame, rows, label_cols, folds, draw)
    return rows[which != fold], rows[which == fold]


def target_rows(target_train) -> dict:
    """The target's row settings of a train task (``label_draw``, ``holdout_folds``, ``holdout_fold``)
    from the config's ``target_train`` block (:class:`~fedcxr.pipeline.config.TargetTrainingConfig`)."""
    holdout = target_train.holdout
    return {"label_draw": target_train.label_draw,
            "holdout_folds": holdout.folds if holdout is not None else 0,
            "holdout_fold": holdout.fold if holdout is not None else 0}
