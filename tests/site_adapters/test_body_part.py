"""Chest radiograph or not, from a DICOM's own tags (hand-computed cases and the real non-chest files)."""

from __future__ import annotations

import pydicom
import pytest

from fedcxr.site_adapters.body_part import not_chest_reason


@pytest.mark.parametrize("tags, reason", [
    ({"Modality": "CR", "BodyPartExamined": "CHEST"}, None),
    ({"Modality": "DX", "BodyPartExamined": "Chest_PA"}, None),
    ({"Modality": "CR", "BodyPartExamined": "TORAX"}, None),                 # PadChest's Spanish
    ({"Modality": "CR", "BodyPartExamined": "CHEST RIBS"}, None),            # names the chest: kept
    ({"Modality": "DX"}, None),                                              # nothing said: kept
    ({"Modality": "OT", "StudyDescription": "No Finding"}, None),           # NIH's GCP conversion
    ({"Modality": "CR", "BodyPartExamined": "PORTABLE"}, None),             # unknown word: kept
    ({"Modality": "CR", "BodyPartExamined": "HIP"}, "not a chest radiograph: BodyPartExamined 'HIP'"),
    ({"Modality": "DX", "BodyPartExamined": "L-SPINE KNEE"}, "not a chest radiograph: BodyPartExamined 'L-SPINE KNEE'"),
    ({"Modality": "CT", "BodyPartExamined": "CHEST"}, "not a chest radiograph: Modality 'CT'"),
    ({"Modality": "MG"}, "not a chest radiograph: Modality 'MG'"),
    ({"Modality": "CR", "StudyDescription": "XR KNEE 2V"},
     "not a chest radiograph: StudyDescription names KNEE (no BodyPartExamined)"),
    ({"Modality": "CR", "StudyDescription": "CHEST AND ABDOMEN"}, None),    # a chest word: kept
    ({"Modality": "CR", "BodyPartExamined": "CHEST", "StudyDescription": "HIP"}, None),  # the tag decides
])
def test_positive_evidence_only(tags, reason):
    assert not_chest_reason(tags) == reason


def test_real_non_chest_files_and_real_chest_files(shared_data):
    folder = shared_data / "dicom"
    keywords = ("Modality", "BodyPartExamined", "StudyDescription", "SeriesDescription")
    for path in sorted(folder.rglob("*.dcm")):
        ds = pydicom.dcmread(path, force=True, stop_before_pixels=True)
        reason = not_chest_reason({k: str(ds.get(k)) if ds.get(k) is not None else None for k in keywords})
        assert (reason is not None) == (path.parent.name == "nonchest"), (path.name, reason)
