"""Predictions of a finished run (fedcxr.pipeline.predictions): keys instead of ids, the model each site deploys."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.predictions import load_final, patient_keys, row_keys, site_params, write_predictions

from ..conftest import tiny_config


def test_predictions_hold_keys_labels_and_probabilities_but_no_identifier(tiny_manifests, tmp_path):
    run = tmp_path / "run"
    run_experiment(load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)), run, progress=False)
    frame = pd.read_parquet(write_predictions(run, "test", device="cpu"))
    manifest = pd.read_parquet(tiny_manifests / "dicom_style" / "manifest.parquet")
    test_rows = manifest.loc[manifest["split"] == "test"]
    assert len(frame) == len(test_rows) and set(frame["site"]) == {"dicom_style"}
    assert not {"patient_id", "image_path", "study_id"} & set(frame.columns)
    assert set(frame["row_key"]) == set(row_keys(manifest)[test_rows.index])  # the site can find its rows again
    assert frame["patient_key"].nunique() == test_rows["patient_id"].nunique()
    assert not set(frame["patient_key"]) & set(manifest["patient_id"])
    probs = frame[[c for c in frame.columns if c.startswith("prob__")]].to_numpy()
    assert ((probs >= 0) & (probs <= 1)).all()


def test_keys_are_stable_for_the_same_manifest_and_differ_for_another():
    a = pd.DataFrame({"patient_id": ["p1", "p1", "p2"], "image_path": ["x", "y", "z"]})
    b = a.assign(image_path=["x", "y", "w"])
    assert row_keys(a).tolist() == row_keys(a.copy()).tolist()
    assert row_keys(a).tolist() != row_keys(b).tolist()
    keys = patient_keys(a, a["patient_id"])
    assert keys[0] == keys[1] != keys[2]


def test_a_per_site_method_scores_each_site_with_its_own_model():
    g = {"w": torch.zeros(1), "bn": torch.zeros(1)}
    final = {"global": g, "per_site": {"a": {"w": torch.ones(1), "bn": torch.zeros(1)}},
             "local_states": {"b": {"bn": torch.full((1,), 5.0)}}, "eval_local_keys": ["bn"]}
    assert float(site_params(final, "a")["w"]) == 1.0
    b = site_params(final, "b")
    assert float(b["w"]) == 0.0 and float(b["bn"]) == 5.0


def test_an_unfinished_run_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a finished run"):
        load_final(tmp_path)
