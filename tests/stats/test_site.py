"""A site's own counts from its manifest and from image headers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcxr.stats import groups as G
from fedcxr.stats.site import manifest_groups


def frame() -> pd.DataFrame:
    nan = np.nan
    return pd.DataFrame({
        "split": ["train", "train", "train", "val", "test"],
        "label__pneumonia": [1.0, 0.0, nan, 0.0, 1.0],
        "raw__pneumonia": [1.0, -1.0, nan, 0.0, 1.0],  # row 1: uncertain at the source, 0 after the policy
        "label__edema": [nan, nan, nan, 1.0, nan],
        "aux__sex": [0, 1, 1, None, 0],
        "aux__age_bin": [2, 2, None, 4, 0],
        "aux__race": [None] * 5,
        "aux__view": [0, 1, 2, 1, 0],
    })


def test_manifest_counts_by_hand():
    out = manifest_groups(frame(), ["pneumonia", "edema"])
    assert out["split"].tolist() == [3, 1, 1]
    assert out["train_labels"].tolist() == [2, 1]  # the third train row has no label of the class set
    assert out["label.pneumonia"].tolist() == [2, 1, 1, 1]  # positive, negative, uncertain (raw -1), blank
    assert out["label.edema"].tolist() == [1, 0, 0, 4]
    assert out["sex"].tolist() == [2, 2, 1]  # F, M, unknown
    assert out["age_bin"].tolist() == [1, 0, 2, 0, 1, 1]
    assert out["race"].tolist() == [0, 0, 0, 0, 0, 5]
    assert out["view"].tolist() == [2, 2, 1, 0]
    pyramid = dict(zip(G.categories(G.PYRAMID), out[G.PYRAMID].tolist()))
    assert pyramid["F/40-59"] == 1 and pyramid["F/0-19"] == 1 and pyramid["M/40-59"] == 1
    assert pyramid[G.UNKNOWN] == 2 and sum(pyramid.values()) == 5


def test_every_group_partitions_its_rows():
    out = manifest_groups(frame(), ["pneumonia", "edema"])
    for name, cells in out.items():
        assert len(cells) == len(G.categories(name))
        assert cells.sum() == (3 if name == "train_labels" else 5), name


def test_header_categories_never_pass_a_free_text_tag_on():
    dicom = {"kind": "dicom", "rows": 2048, "cols": 2500, "Modality": "dx", "Manufacturer": "GE Healthcare",
             "PhotometricInterpretation": "MONOCHROME1"}
    assert G.header_categories(dicom) == {"file_format": "dicom", "modality": "DX", "manufacturer": "GE",
                                          "photometric": "MONOCHROME1", "image_rows": "2048-2559",
                                          "image_cols": "2048-2559"}
    assert G.manufacturer_category("dicom", "Hospital X Homebuilt Rig 7") == G.OTHER
    assert G.manufacturer_category("dicom", "FUJIFILM Corporation") == "Fujifilm"
    assert G.manufacturer_category("dicom", "Agfa-Gevaert") == "Agfa"
    assert G.manufacturer_category("dicom", "Siemens Healthineers") == "Siemens"
    assert G.manufacturer_category("dicom", "Imaging Dynamics") == G.OTHER  # not GE despite the "ge"
    png = G.header_categories({"kind": "png", "rows": 100, "cols": 64})
    assert png["modality"] == png["manufacturer"] == png["photometric"] == G.NOT_DICOM
    assert png["image_rows"] == "<128"
    assert G.header_categories(None)["file_format"] == "unreadable"
