"""Which labeled rows a target trains on (fedcxr.pipeline.labeled_rows): the draw and the held-out fold."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcxr.pipeline.config import config_fingerprint, load_config
from fedcxr.pipeline.labeled_rows import patient_folds, select_labeled, split_holdout
from fedcxr.site_adapters.manifest import patient_bucket

COLS = ["label__pneumonia"]


def _frame(n_patients: int = 60, seed: int = 0) -> pd.DataFrame:
    """1–3 rows per patient, 40 % positive patients, a few rows without a label."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_patients):
        label = float(p % 5 < 2)
        for _ in range(int(rng.integers(1, 4))):
            rows.append({"patient_id": f"p{p:03d}", "label__pneumonia": label if rng.random() > 0.1 else np.nan})
    return pd.DataFrame(rows)


def _patients(frame: pd.DataFrame, rows) -> set:
    return set(frame["patient_id"].iloc[list(rows)])


def _whole_patients_but_the_last(frame: pd.DataFrame, rows) -> bool:
    """Every chosen patient has all its labeled rows chosen, but at most one (the one at the cut)."""
    labeled = frame.loc[frame[COLS].notna().any(axis=1)]
    chosen = frame.iloc[list(rows)]
    partial = [p for p, g in chosen.groupby("patient_id") if len(g) < (labeled["patient_id"] == p).sum()]
    return len(partial) <= 1


def test_the_fixed_draw_is_the_one_earlier_versions_made():
    """``label_draw: null``: the rows of every earlier version (the patient-hash order, salt ``fedcxr-labeled``)."""
    frame = _frame()
    labeled = np.flatnonzero(frame[COLS].notna().any(axis=1).to_numpy())
    order = np.argsort(patient_bucket(frame["patient_id"].iloc[labeled], salt="fedcxr-labeled"), kind="stable")
    assert select_labeled(frame, COLS, 25).tolist() == sorted(labeled[order][:25].tolist())
    assert select_labeled(frame, COLS, 0.25).size == round(0.25 * len(frame))
    assert select_labeled(frame, COLS, None).tolist() == labeled.tolist()


def test_different_draws_pick_different_whole_patients_and_the_same_draw_the_same():
    frame = _frame()
    draws = {k: select_labeled(frame, COLS, 25, draw=k) for k in (None, 0, 1, 2)}
    assert all(len(rows) == 25 for rows in draws.values())  # the budget holds in every draw
    assert all(frame[COLS].iloc[rows].notna().all(axis=None) for rows in draws.values())
    patients = {k: _patients(frame, rows) for k, rows in draws.items()}
    for a in draws:
        for b in draws:
            if a != b:
                assert patients[a] != patients[b] and len(patients[a] & patients[b]) < len(patients[a]), (a, b)
    assert all(_whole_patients_but_the_last(frame, rows) for rows in draws.values())
    assert select_labeled(frame, COLS, 25, draw=1).tolist() == draws[1].tolist()  # reproducible
    assert select_labeled(frame.copy(), COLS, 25, draw=1).tolist() == draws[1].tolist()


def test_holdout_folds_are_whole_patients_stratified_and_partition_the_draw():
    frame = _frame()
    rows = select_labeled(frame, COLS, 30, draw=3)
    folds = patient_folds(frame, rows, COLS, 3, draw=3)
    assert sorted(set(folds)) == [0, 1, 2]
    ids = frame["patient_id"].iloc[rows].to_numpy()
    assert all(len(set(folds[ids == p])) == 1 for p in set(ids))  # a patient never straddles two folds
    positive = frame[COLS[0]].iloc[rows].to_numpy() == 1
    assert all(positive[folds == f].any() and (~positive[folds == f]).any() for f in range(3))  # both classes
    seen = []
    for fold in range(3):
        kept, out = split_holdout(frame, rows, COLS, 3, fold, draw=3)
        assert sorted([*kept, *out]) == rows.tolist() and not set(kept) & set(out)
        assert not _patients(frame, kept) & _patients(frame, out)
        seen += out.tolist()
    assert sorted(seen) == rows.tolist()  # every labeled row is held out exactly once
    with pytest.raises(ValueError, match="fold 3"):
        split_holdout(frame, rows, COLS, 3, 3)


def test_label_draw_and_holdout_in_the_config_and_its_fingerprint():
    base = {"sites": ["a"]}
    plain = load_config(data=base, check_sites=False)
    assert plain.target_train.label_draw is None and plain.target_train.holdout is None
    assert config_fingerprint(plain) == "5de14a000d548775"  # unset: the fingerprint earlier runs resume with
    drawn = load_config(data={**base, "target_train": {"label_draw": 2}}, check_sites=False)
    other = load_config(data={**base, "target_train": {"label_draw": 3}}, check_sites=False)
    assert len({config_fingerprint(c) for c in (plain, drawn, other)}) == 3
    held = load_config(data={**base, "target_train": {"holdout": {"folds": 3, "fold": 1}}}, check_sites=False)
    assert (held.target_train.holdout.folds, held.target_train.holdout.fold) == (3, 1)
    assert config_fingerprint(held) != config_fingerprint(plain)
    from fedcxr.errors import UserError

    for bad in ({"holdout": {"folds": 3, "fold": 3}}, {"holdout": {"folds": 1, "fold": 0}}, {"label_draw": -1}):
        with pytest.raises(UserError, match="target_train"):
            load_config(data={**base, "target_train": bad}, check_sites=False)


def test_the_site_trains_on_the_draw_and_scores_the_held_out_fold(tiny_manifests, tmp_path):
    """SiteRunner: a train task's ``label_draw`` and ``holdout`` pick the rows it trains on; the held-out
    fold's rows are the ones it does not train on."""
    from fedcxr.pipeline.devices import resolve_device
    from fedcxr.pipeline.inprocess import build_runners
    from fedcxr.pipeline.messages import TrainTask

    from ..conftest import tiny_config

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache"))
    runner = build_runners(cfg, resolve_device("cpu"), progress=False)[cfg.site_name(cfg.target)]
    classes = runner.class_set

    def task(**extra) -> TrainTask:
        return TrainTask.build(round=0, seed=0, role="target", head_classes=classes, param_classes=classes, lr=1e-3,
                               batch_size=4, steps=1, labeled=12, **extra)

    def trained_on(**extra) -> list[int]:
        return list(runner.training_data(task(**extra), classes, []).indices)

    fixed, d0, d1 = trained_on(), trained_on(label_draw=0), trained_on(label_draw=1)
    assert len(fixed) == len(d0) == len(d1) == 12 and len({tuple(fixed), tuple(d0), tuple(d1)}) == 3
    assert trained_on(label_draw=1) == d1
    kept = trained_on(label_draw=1, holdout_folds=3, holdout_fold=0)
    out = runner.labeled_rows("train", classes, 12, 1, (3, 0), held_out=True)
    assert sorted(kept + out) == d1 and out and not set(kept) & set(out)
