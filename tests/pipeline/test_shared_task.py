"""One binary task shared by every site, each mapping its own condition onto it (AuxInfo+GP CheXpert)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcxr.pipeline.data import SiteInfo
from fedcxr.pipeline.shared_task import UNUSED_SPLIT, apply_shared_task, site_task
from fedcxr.vocab import label_column, raw_column


def _site() -> SiteInfo:
    """20 train rows: 4 positive for pneumonia, 6 labeled 0, 10 blank; edema labeled everywhere."""
    pneu = [1.0] * 4 + [0.0] * 6 + [np.nan] * 10
    frame = pd.DataFrame({
        "patient_id": [f"p{i}" for i in range(20)], "split": ["train"] * 20,
        label_column("pneumonia"): pneu, raw_column("pneumonia"): pneu,
        label_column("edema"): [1.0, 0.0] * 10,
    })
    return SiteInfo(name="pneumonia", site_dir=Path("."), manifest=frame, meta={}, export_root=Path("."),
                    class_set=["edema", "pneumonia"])


SPEC = {"output": "edema", "site_labels": {"pneumonia": "pneumonia"}, "balance": True, "negatives": "zero"}


def test_the_sites_condition_becomes_the_shared_output_and_nothing_else_is_labeled():
    out = apply_shared_task(_site(), site_task({**SPEC, "balance": False}, "pneumonia"))
    assert out.class_set == ["edema"]
    got = out.manifest[label_column("edema")]
    assert got.iloc[:4].eq(1).all() and got.iloc[4:10].eq(0).all() and got.iloc[10:].isna().all()
    assert out.manifest[label_column("pneumonia")].isna().all()


@pytest.mark.parametrize("negatives, pool", [("zero", range(4, 10)), ("unmentioned", range(10, 20))])
def test_balance_keeps_every_positive_and_as_many_negatives_of_the_chosen_kind(negatives, pool):
    out = apply_shared_task(_site(), site_task({**SPEC, "negatives": negatives}, "pneumonia")).manifest
    used = out[out["split"] == "train"]
    labels = used[label_column("edema")]
    assert (labels == 1).sum() == 4 and (labels == 0).sum() == 4 and labels.notna().all()
    assert set(used.index[labels == 0]) <= set(pool)
    assert (out["split"] == UNUSED_SPLIT).sum() == 12  # left out, not deleted: the image cache order holds
    again = apply_shared_task(_site(), site_task({**SPEC, "negatives": negatives}, "pneumonia")).manifest
    assert again.equals(out)  # the same rows every time


def test_a_site_without_a_task_label_or_with_a_class_it_lacks_is_refused():
    with pytest.raises(ValueError, match="no entry for site 'other'"):
        site_task(SPEC, "other")
    with pytest.raises(ValueError, match="does not label"):
        apply_shared_task(_site(), site_task({**SPEC, "site_labels": {"pneumonia": "fracture"}}, "pneumonia"))


def test_a_shared_task_run_trains_one_output_at_every_site(tiny_manifests, tmp_path):
    """Sources labeling different conditions all train the target's one output."""
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment

    from ..conftest import tiny_config

    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=1, strategy="FedAvg_Finetune",
                       task={"output": "cardiomegaly", "balance": True,
                             "site_labels": {"nih_style": "cardiomegaly", "chexpert_style": "edema",
                                             "dicom_style": "cardiomegaly"}})
    run = run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    assert run["classes"] == ["cardiomegaly"]
    assert all(cs == ["cardiomegaly"] for cs in run["class_sets"].values())


def test_the_config_names_a_site_without_a_task_label():
    from fedcxr.errors import UserError
    from fedcxr.pipeline.config import load_config

    with pytest.raises(UserError, match=r"no class given for site\(s\) \['t'\]"):
        load_config(data={"sites": ["a"], "target": "t", "task": {"output": "edema", "site_labels": {"a": "edema"}}},
                    check_sites=False)
