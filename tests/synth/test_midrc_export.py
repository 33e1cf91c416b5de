"""MIDRC-style export: Gen3 template headers and enums, links between nodes, states."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pydicom
import pytest

from fedcxr.synth.export import write_hospital
from fedcxr.synth.hospitals import HOSPITALS
from fedcxr.synth.midrc_export import (
    CASE_HEADER,
    MEASUREMENT_HEADER,
    SERIES_HEADER,
    STUDY_HEADER,
    tsv,
)

N = 80


@pytest.fixture(scope="module")
def midrc(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("midrc")
    info = write_hospital(HOSPITALS["midrc_style"], out, n_images=N, image_size=32, seed=2)
    return out / "midrc_style", info


def read(root: Path, name: str) -> pd.DataFrame:
    """A node TSV with the required-column ``*`` marks stripped from the header."""
    frame = pd.read_csv(root / name, sep="\t", dtype=str, keep_default_na=False)
    return frame.rename(columns=lambda c: c.lstrip("*"))


def test_headers_are_the_gen3_submission_templates(midrc, shared_data):
    root, _ = midrc
    templates = shared_data / "schemas/midrc"
    for name, header in (("case", CASE_HEADER), ("imaging_study", STUDY_HEADER),
                         ("cr_series_file", SERIES_HEADER), ("dx_series_file", SERIES_HEADER),
                         ("measurement", MEASUREMENT_HEADER)):
        template = (templates / f"submission_{name}_template.tsv").read_text().split("\n", 1)[0]
        assert template.rstrip("\r").split("\t") == header, name
        assert (root / f"{name}.tsv").read_text().split("\n", 1)[0].split("\t") == header


def test_case_values_come_from_the_midrc_enums(midrc, shared_data):
    root, _ = midrc
    enums = pd.read_csv(shared_data / "schemas/midrc/enums_midrc.tsv", sep="\t", dtype=str)
    allowed = enums.loc[enums["<node>"] == "case"].groupby("<property>")["<enum_value>"].apply(set)
    cases = read(root, "case.tsv")
    for column in ("sex", "race", "ethnicity", "covid19_positive", "age_at_index_gt89"):
        assert set(cases[column]) <= allowed[column], column
    assert {"Yes", "No"} <= set(cases["covid19_positive"])
    assert cases["zip"].str.fullmatch(r"\d{3}").all() and "000" in set(cases["zip"]) or len(cases) < 30
    over = cases["age_at_index_gt89"] == "Yes"
    assert (cases.loc[over, "age_at_index"] == "").all()
    assert cases.loc[~over, "age_at_index"].astype(int).between(0, 89).all()
    hispanic = cases["ethnicity"] == "Hispanic or Latino"
    assert hispanic.any() and not set(cases.loc[hispanic, "race"]) & {"Hispanic or Latino"}


def test_nodes_link_and_files_match_their_checksums(midrc):
    root, info = midrc
    cases, studies = read(root, "case.tsv"), read(root, "imaging_study.tsv")
    series = pd.concat([read(root, "cr_series_file.tsv"), read(root, "dx_series_file.tsv")])
    assert set(studies["cases.submitter_id"]) <= set(cases["submitter_id"])
    assert set(series["imaging_studies.submitter_id"]) <= set(studies["submitter_id"])
    assert studies["study_modality"].isin(['["CR"]', '["DX"]']).all()
    assert series["view_position"].str.contains(r"^\[").any()  # some view positions are arrays
    for row in series.itertuples():
        data = (root / row.file_name).read_bytes()
        assert str(len(data)) == row.file_size and hashlib.md5(data).hexdigest() == row.md5sum
    files = {p.relative_to(root).as_posix() for p in (root / "images").rglob("*.dcm")}
    assert len(files) == N and len(files - set(series["file_name"])) == 1  # one file no TSV names
    study_of = dict(zip(studies["study_uid"], studies["cases.submitter_id"]))
    for path in sorted(files)[:10]:
        ds = pydicom.dcmread(root / path, stop_before_pixels=True)
        assert study_of[ds.StudyInstanceUID] == ds.PatientID  # MIDRC writes the case id there
    assert info["files"]["unlisted_file"] is True


def test_site_by_state_splits_into_two_states(midrc, tmp_path):
    pytest.importorskip("fedcxr.site_adapters.midrc")
    from fedcxr.site_adapters.ingest import run_ingest

    root, info = midrc
    report = run_ingest("midrc", root, tmp_path, site_by="state", progress=False)
    assert set(report["sites"]) == {"IL", "TX"}
    small_area = info["files"]["patients_per_state"].get("none (zip 000)", 0)
    assert (report["rows_set_aside"] > 0) == (small_area > 0)
    assert all(r["reason"] == "no value for site column 'state'" for r in report["set_aside"])


def test_tsv_refuses_cells_that_would_break_the_format():
    assert tsv(["*type", "a"], [{"type": "case", "a": '["PA"]'}]) == '*type\ta\ncase\t["PA"]\n'
    with pytest.raises(ValueError, match="tab"):
        tsv(["a"], [{"a": "x\ty"}])
