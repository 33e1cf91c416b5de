"""The new sources on their real metadata, against TorchXRayVision's reading of the same files.

Runs when ``FEDCXR_TXRV_DATA`` names a local copy of TorchXRayVision's ``torchxrayvision/data``
folder (``kaggle_stage_2_train_labels.csv.zip``, ``vinbigdata-train.csv.gz``,
``siim-pneumothorax-train-rle.csv.gz``, ``NLMCXR_reports.tgz``, ``nlmcxr_dicom_metadata.csv.gz``);
skipped otherwise. The files are read in place (RSNA's zip is unpacked into the test's tmp
folder); none is copied into the repository. The reference reading below re-implements what
``torchxrayvision/datasets.py`` does with each file (its view and unique-patient filters off),
so a count that differs is a difference of *semantics*, each one asserted and explained.
"""

from __future__ import annotations

import os
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcxr.site_adapters.base import IngestError

DATA = os.environ.get("FEDCXR_TXRV_DATA")
pytestmark = [pytest.mark.skipif(not DATA, reason="set FEDCXR_TXRV_DATA to TorchXRayVision's data/ folder to run"),
              pytest.mark.slow]  # ~15 s on the full files when they are there


def data(name: str) -> Path:
    path = Path(DATA) / name
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


def positives(frame: pd.DataFrame) -> dict[str, int]:
    return {c[5:]: int((frame[c] == 1).sum()) for c in frame if c.startswith("raw__")}


def test_rsna_labels_equal_torchxrayvisions_and_every_image_is_accounted(tmp_path):
    from fedcxr.site_adapters.ingest import run_ingest
    from fedcxr.site_adapters.rsna import read_rsna_labels

    with zipfile.ZipFile(data("kaggle_stage_2_train_labels.csv.zip")) as archive:
        archive.extract("stage_2_train_labels.csv", tmp_path / "rsna")
    frame, aside, _, rows_read, classes = read_rsna_labels(tmp_path / "rsna")
    reference = pd.read_csv(tmp_path / "rsna" / "stage_2_train_labels.csv").groupby("patientId").first()
    assert rows_read == len(reference) == 26_684 and not aside and classes == ["pneumonia", "lung_opacity"]
    assert positives(frame) == {"pneumonia": 6_012, "lung_opacity": 6_012} == {
        "pneumonia": int(reference["Target"].sum()), "lung_opacity": int(reference["Target"].sum())}
    with pytest.raises(IngestError, match="all 26684 row"):  # metadata only: every image set aside as missing
        run_ingest("rsna", tmp_path / "rsna", tmp_path / "out", progress=False)
    report = pd.read_csv(tmp_path / "out" / "set_aside.csv")
    assert len(report) == 26_684 and set(report["reason"]) == {"missing file"}


def test_vindr_any_rule_equals_torchxrayvision_on_all_14_findings():
    from fedcxr.site_adapters.vindr import read_vindr_labels

    folder = data("vinbigdata-train.csv.gz").parent
    frame, aside, _, rows_read, _ = read_vindr_labels(folder, "any")
    raw = pd.read_csv(folder / "vinbigdata-train.csv.gz")
    joined = raw.groupby("image_id")["class_name"].apply(lambda x: "|".join(np.unique(x))).str.lower()
    txrv = {"aortic_enlargement": "aortic enlargement", "atelectasis": "atelectasis", "calcification": "calcification",
            "cardiomegaly": "cardiomegaly", "consolidation": "consolidation", "ild": "ild",
            "infiltration": "infiltration", "lung_opacity": "lung opacity", "nodule_mass": "nodule/mass",
            "other_lesion": "lesion", "pleural_effusion": "effusion", "pleural_thickening": "pleural thickening",
            "pneumothorax": "pneumothorax", "pulmonary_fibrosis": "pulmonary fibrosis"}
    ours = positives(frame)
    assert rows_read == len(joined) == 15_000 and not aside
    assert {c: ours[c] for c in txrv} == {c: int(joined.str.contains(s, regex=False).sum()) for c, s in txrv.items()}
    assert ours["no_finding"] == 10_606  # every reader of these images said "No finding"
    majority = positives(read_vindr_labels(folder, "majority")[0])
    assert all(majority[c] <= ours[c] for c in txrv) and majority["cardiomegaly"] == 1_817


def test_siim_counts_images_where_torchxrayvision_counts_mask_rows():
    from fedcxr.site_adapters.siim import read_siim_labels

    path = data("siim-pneumothorax-train-rle.csv.gz")
    frame, aside, _, rows_read = read_siim_labels(path.parent)
    raw = pd.read_csv(path)
    txrv_rows = int((raw[" EncodedPixels"] != "-1").sum())  # one sample per row there
    by_image = (raw[" EncodedPixels"].str.strip() != "-1").groupby(raw["ImageId"]).any()
    assert (len(raw), txrv_rows) == (12_954, 3_576)
    assert rows_read == len(by_image) == 12_047 and not aside
    assert positives(frame) == {"pneumothorax": int(by_image.sum())} == {"pneumothorax": 2_669}


#: Open-i terms where an exact term table and TorchXRayVision's substring match disagree, by class.
OPENI_EXPLAINED = {
    "cardiomegaly": {"enlarged heart"},
    "pleural_effusion": {"pleural fluid", "pericardial effusion", "pulmonary effusion"},
    "emphysema": {"subcutaneous emphysema"},
    "fibrosis": {"fibroses", "pulmonary fibroses", "cystic fibrosis"},
    "fracture": {"hip fractures", "femoral neck fractures"},
}


def test_openi_positives_differ_from_torchxrayvision_only_where_a_term_explains_it():
    from fedcxr.site_adapters.openi import read_openi_labels

    folder = data("NLMCXR_reports.tgz").parent
    frame, aside, notes, rows_read = read_openi_labels(folder)
    terms = {}
    with tarfile.open(folder / "NLMCXR_reports.tgz", "r:gz") as tar:
        for name in tar.getnames():
            if name.endswith(".xml"):
                root = ET.parse(tar.extractfile(name)).getroot()
                found = "|".join(np.unique([n.text.lower() for n in root.findall(".//MeSH/automatic")]))
                for image in root.findall(".//parentImage"):
                    terms[image.attrib["id"]] = found
    joined = pd.Series(terms).reindex(frame["_image"]).fillna("")
    txrv = {"atelectasis": ["atelectasis", "atelectases"], "cardiomegaly": ["cardiomegaly"], "edema": ["edema"],
            "pleural_effusion": ["effusion"], "emphysema": ["emphysema"], "fibrosis": ["fibrosis"],
            "fracture": ["fracture"], "granuloma": ["granuloma"], "calcified_granuloma": ["calcified granuloma"],
            "hernia": ["hernia"], "infiltration": ["infiltration", "infiltrate"], "lung_lesion": ["lesion"],
            "mass": ["mass"], "nodule": ["nodule"], "lung_opacity": ["opacity"],
            "pleural_thickening": ["pleural thickening", "pleural_thickening"], "pneumonia": ["pneumonia"],
            "pneumothorax": ["pneumothorax"]}
    assert rows_read == len(frame) == 7_470 and not aside
    counts = {}
    for cls, substrings in txrv.items():
        reference = np.logical_or.reduce([joined.str.contains(s, regex=False).to_numpy() for s in substrings])
        ours = (frame[f"raw__{cls}"] == 1).to_numpy()
        counts[cls] = (int(ours.sum()), int(reference.sum()))
        for i in np.flatnonzero(ours != reference):
            report_terms = set(joined.iloc[i].split("|"))
            assert report_terms & OPENI_EXPLAINED.get(cls, set()), (cls, joined.iloc[i])
    assert counts["cardiomegaly"] == (503, 493) and counts["pleural_effusion"] == (336, 346)
    assert counts["atelectasis"] == (711, 711) and counts["lung_opacity"] == (819, 819)
    unlabeled = frame[[c for c in frame if c.startswith("raw__")]].isna().all(axis=1)
    assert int(unlabeled.sum()) == 712  # no automatic term and not coded normal: TorchXRayVision makes them 0
