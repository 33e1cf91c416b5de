"""Hostile hospital exports (SECURITY.md: "Ingest").

Each case builds an export a careless or hostile site could send through ``fedcxr ingest`` and
asserts what the user relies on: the row is set aside with a reason naming it (or the ingest
stops with exit 2 and a message naming the file/row), nothing outside the export is read, no
raw patient or study id reaches any output file, and every row read is accounted for
(``rows_read == rows_kept + rows_set_aside``, and ``set_aside.csv`` lists each set-aside row).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pydicom
import pytest
import yaml
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.manifest import read_manifest
from fedcxr.site_adapters.sitekey import KEY_FILE_NAME, load_site_key

from ..conftest import write_csv_export

pytestmark = pytest.mark.filterwarnings("ignore:Invalid value for VR")

MAPPING = {
    "image": {"column": "image", "prefix": "images", "extension": ".png"},
    "patient": "pid",
    "study": "study",
    "classes": ["edema"],
    "labels": {"edema": "edema"},
}


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def key(tmp_path) -> Path:
    """A fixed site key (fixed pseudonyms: a scan for raw ids cannot pass or fail by chance)."""
    path = tmp_path / "site.key"
    path.write_text("5a" * 32 + "\n")
    path.chmod(0o600)
    return path


def write_dicom(path: Path, *, rows: int = 16, cols: int = 16, seed: int = 0, pixels=None, **tags) -> dict:
    """A small uncompressed 16-bit DICOM; returns its UIDs. ``pixels`` overrides the noise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = tags.pop("SOPInstanceUID", None) or generate_uid()
    ds.StudyInstanceUID = tags.pop("StudyInstanceUID", None) or generate_uid()
    ds.SeriesInstanceUID, ds.Modality = generate_uid(), "CR"
    ds.Rows, ds.Columns = rows, cols
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    if pixels is None:
        pixels = np.random.default_rng(seed).integers(0, 4096, (rows, cols))
    ds.PixelData = np.asarray(pixels).astype("<u2").tobytes()
    for name, value in tags.items():
        setattr(ds, name, value)
    ds.save_as(path, enforce_file_format=True)
    return {"sop": str(ds.SOPInstanceUID), "study": str(ds.StudyInstanceUID)}


def png(path: Path, size: int = 16, seed: int = 0, value=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (np.full((size, size), value, np.uint8) if value is not None
            else np.random.default_rng(seed).integers(0, 256, (size, size), dtype=np.uint8))
    Image.fromarray(data, "L").save(path)
    return path


def csv_rows(n: int, prefix: str = "MRN-SECRET-") -> list[dict]:
    return [{"image": f"im{i}", "pid": f"{prefix}{i // 2:04d}", "study": f"ACC-SECRET-{i:05d}",
             "edema": str(i % 2)} for i in range(n)]


def output_text(out: Path) -> str:
    """Everything ingest wrote under ``out`` as text (Parquet cells included), except the key."""
    parts = []
    for path in sorted(out.rglob("*")):
        if not path.is_file() or path.name == KEY_FILE_NAME:
            continue
        if path.suffix == ".parquet":
            frame = pd.read_parquet(path)
            parts.append(" ".join(frame.columns) + "\n" + frame.astype(str).to_csv(index=False))
        elif path.suffix in {".json", ".csv", ".txt", ".md"}:
            parts.append(path.read_text())
    return "\n".join(parts)


def assert_no_raw_ids(out: Path, ids) -> None:
    text = output_text(out)
    assert (out / "ingest_report.json").is_file() and (out / "set_aside.csv").is_file()
    leaked = sorted({i for i in ids if i and i in text})
    assert not leaked, f"raw ids in ingest outputs: {leaked[:5]}"


def accounted(report: dict, out: Path) -> None:
    """rows read = kept + set aside, in the report, in the manifests and in set_aside.csv."""
    assert report["rows_read"] == report["rows_kept"] + report["rows_set_aside"]
    kept = sum(len(read_manifest(out / s)) for s in report["sites"])
    assert kept == report["rows_kept"]
    listed = pd.read_csv(out / "set_aside.csv", dtype=str, keep_default_na=False)
    assert len(listed) == report["rows_set_aside"] and (listed["reason"] != "").all()


def reasons_by_path(report: dict) -> dict:
    return {r["image_path"]: r["reason"] for r in report["set_aside"]}


# --------------------------------------------------------------------------- 1. keyed pseudonyms


def test_csv_ids_never_reach_any_output_and_pseudonyms_are_keyed(tmp_path, key):
    export, mapping = write_csv_export(tmp_path, csv_rows(24), MAPPING)
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=mapping, site_key=key, progress=False)
    accounted(report, out)
    assert_no_raw_ids(out, [r["pid"] for r in csv_rows(24)] + [r["study"] for r in csv_rows(24)] + ["SECRET"])
    frame = read_manifest(out / "csv")
    secret = load_site_key(key, out)
    assert set(frame["patient_id"]) == {secret.pseudonym("patient", r["pid"]) for r in csv_rows(24)}
    assert frame["image_key"].is_unique and frame["image_key"].str.fullmatch("[0-9a-f]{20}").all()
    site = json.loads((out / "csv" / "site.json").read_text())
    assert site["manifest_version"] == 2 and site["pseudonyms"]["key_id"] == secret.key_id
    assert "5a5a5a" not in output_text(out) and not (out / KEY_FILE_NAME).exists()


def test_same_key_same_pseudonyms_and_splits_other_key_other_pseudonyms(tmp_path, key):
    export, mapping = write_csv_export(tmp_path, csv_rows(40), MAPPING)
    runs = {}
    for name, key_file in (("a", key), ("b", key), ("c", None)):
        run_ingest("csv", export, tmp_path / name, mapping=mapping, site_key=key_file, progress=False)
        runs[name] = read_manifest(tmp_path / name / "csv").sort_values("image_path").reset_index(drop=True)
    assert runs["a"][["patient_id", "study_id", "image_key", "split"]].equals(
        runs["b"][["patient_id", "study_id", "image_key", "split"]])
    assert not set(runs["a"]["patient_id"]) & set(runs["c"]["patient_id"])
    assert (tmp_path / "c" / KEY_FILE_NAME).is_file()  # no key given: one was created in OUT, 0600
    assert (tmp_path / "c" / KEY_FILE_NAME).stat().st_mode & 0o077 == 0
    again = run_ingest("csv", export, tmp_path / "c", mapping=mapping, progress=False)
    assert again["rows_kept"] == 40
    rerun = read_manifest(tmp_path / "c" / "csv").sort_values("image_path").reset_index(drop=True)
    assert rerun["patient_id"].equals(runs["c"]["patient_id"]) and rerun["split"].equals(runs["c"]["split"])


def test_dicom_patient_and_study_uids_never_reach_any_output(tmp_path, key):
    export = tmp_path / "export"
    ids = []
    for i in range(8):
        uids = write_dicom(export / f"f{i}.dcm", seed=i, PatientID=f"MRN-DCM-{i // 2:03d}", PatientSex="F")
        ids += [f"MRN-DCM-{i // 2:03d}", uids["study"], uids["sop"]]
    pd.DataFrame({"file": [f"f{i}.dcm" for i in range(8)], "edema": [i % 2 for i in range(8)]}).to_csv(
        tmp_path / "labels.csv", index=False)
    out = tmp_path / "out"
    report = run_ingest("dicom", export, out, labels_csv=tmp_path / "labels.csv", site_key=key, progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 8
    assert_no_raw_ids(out, ids + ["MRN-DCM"])


def test_real_dicom_tags_never_reach_any_output(shared_data, tmp_path, key):
    export = shared_data / "dicom"
    ids = []
    for path in export.rglob("*.dcm"):
        ds = pydicom.dcmread(path, force=True, stop_before_pixels=True)
        ids += [str(ds.get(k, "")).strip() for k in ("PatientID", "StudyInstanceUID", "SOPInstanceUID",
                                                     "AccessionNumber")]
    ids = [i for i in ids if len(i) >= 4]
    assert len(ids) >= 12
    out = tmp_path / "out"
    labels = pd.DataFrame({"file": [p.relative_to(export).as_posix() for p in sorted(export.rglob("*.dcm"))]})
    labels["pneumonia"] = [i % 2 for i in range(len(labels))]
    labels.to_csv(tmp_path / "labels.csv", index=False)
    report = run_ingest("dicom", export, out, labels_csv=tmp_path / "labels.csv", site_key=key, progress=False)
    accounted(report, out)
    assert report["rows_kept"] >= 6
    assert_no_raw_ids(out, ids)


def test_real_hannover_patient_ids_never_reach_any_output(shared_data, tmp_path, key):
    export = shared_data / "hannover-covid-19-image-repository"
    mapping = Path(__file__).parents[2] / "examples" / "hannover.yaml"
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=mapping, site_key=key, progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 243
    patients = pd.read_csv(export / "data.csv", dtype=str)["patient_id"].unique().tolist()
    assert len(patients) == 71
    assert_no_raw_ids(out, patients)
    frame = read_manifest(out / "csv")
    assert frame["patient_id"].nunique() == 71 and frame.groupby("patient_id")["split"].nunique().max() == 1


# --------------------------------------------------------------------------- 2. paths stay inside


def path_export(tmp_path: Path, paths: list[str]) -> tuple[Path, Path]:
    """A csv export whose ``path`` column is taken as is, plus a valid PNG OUTSIDE the export.

    The outside file is a good image: had ingest followed the path, the row would be kept.
    """
    export = tmp_path / "export"
    png(export / "images" / "ok.png", seed=1)
    png(tmp_path / "outside" / "secret.png", seed=2)
    rows = [{"path": "images/ok.png", "pid": "p-ok", "edema": "1"}]
    rows += [{"path": p, "pid": f"p{i}", "edema": str(i % 2)} for i, p in enumerate(paths)]
    pd.DataFrame(rows).to_csv(export / "data.csv", index=False)
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(yaml.safe_dump({"csv": "data.csv", "image": "path", "patient": "pid",
                                       "classes": ["edema"], "labels": {"edema": "edema"}}))
    return export, mapping


def ingest_paths(tmp_path, paths, **kwargs):
    export, mapping = path_export(tmp_path, paths)
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=mapping, progress=False, **kwargs)
    accounted(report, out)
    return report, out


ESCAPES = {
    "absolute to a real file": "{outside}/secret.png",
    "dot-dot": "../outside/secret.png",
    "dot-dot after a folder": "images/../../outside/secret.png",
    "dot-dot deep": "images/a/b/../../../../outside/secret.png",
    "backslashes": "images\\..\\..\\outside\\secret.png",
    "windows drive": "C:/outside/secret.png",
    "unc share": "//server/share/secret.png",
    "missing file outside": "../outside/nothing.png",
    "just dot-dot": "..",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_paths_leaving_the_export_are_set_aside_never_read(tmp_path, name):
    raw = ESCAPES[name].format(outside=tmp_path / "outside")
    report, out = ingest_paths(tmp_path, [raw])
    assert report["rows_kept"] == 1 and report["rows_set_aside"] == 1
    reason = report["set_aside"][0]["reason"]
    assert reason.startswith("image path outside the export folder"), reason
    listed = pd.read_csv(out / "set_aside.csv", dtype=str, keep_default_na=False)
    assert listed.loc[0, "row"] == "2" and listed.loc[0, "reason"] == reason


@pytest.mark.parametrize("raw", ["images/../images/ok2.png", "./images/ok2.png", "images//ok2.png",
                                 "images/./ok2.png"])
def test_dot_segments_that_stay_inside_are_kept_and_normalised(tmp_path, raw):
    png(tmp_path / "export" / "images" / "ok2.png", seed=3)
    report, out = ingest_paths(tmp_path, [raw])
    assert report["rows_set_aside"] == 0 and report["rows_kept"] == 2
    assert set(read_manifest(out / "csv")["image_path"]) == {"images/ok.png", "images/ok2.png"}


def _link_file(tmp_path):
    (tmp_path / "export" / "images").mkdir(parents=True, exist_ok=True)
    (tmp_path / "export" / "images" / "link.png").symlink_to(tmp_path / "outside" / "secret.png")
    return "images/link.png"


def _link_folder(tmp_path):
    (tmp_path / "export").mkdir(parents=True, exist_ok=True)
    (tmp_path / "export" / "mounted").symlink_to(tmp_path / "outside", target_is_directory=True)
    return "mounted/secret.png"


@pytest.mark.parametrize("make_link", [_link_file, _link_folder], ids=["file link", "folder link"])
@pytest.mark.parametrize("follow", [False, True], ids=["default", "--follow-links"])
def test_symlinks_out_of_the_export_need_follow_links(tmp_path, make_link, follow):
    png(tmp_path / "outside" / "secret.png", seed=2)
    raw = make_link(tmp_path)
    report, out = ingest_paths(tmp_path, [raw], follow_links=follow)
    if follow:
        assert report["rows_kept"] == 2 and report["rows_set_aside"] == 0
    else:
        assert report["rows_kept"] == 1
        assert "symbolic link" in report["set_aside"][0]["reason"] and "--follow-links" in report["set_aside"][0]["reason"]


def test_symlink_inside_the_export_is_kept(tmp_path):
    png(tmp_path / "export" / "store" / "real.png", seed=4)
    (tmp_path / "export" / "images").mkdir(parents=True)
    (tmp_path / "export" / "images" / "alias.png").symlink_to(tmp_path / "export" / "store" / "real.png")
    report, _ = ingest_paths(tmp_path, ["images/alias.png"])
    assert report["rows_kept"] == 2 and report["rows_set_aside"] == 0


@pytest.mark.parametrize("follow", [False, True], ids=["default", "--follow-links"])
def test_dicom_file_linked_from_outside_is_not_opened(tmp_path, key, follow):
    export = tmp_path / "export"
    for i in range(4):
        write_dicom(export / f"f{i}.dcm", seed=i, PatientID=f"P{i}", StudyDescription="No Finding")
    write_dicom(tmp_path / "outside" / "other_site.dcm", PatientID="OTHER-SITE-MRN", StudyDescription="No Finding")
    (export / "linked.dcm").symlink_to(tmp_path / "outside" / "other_site.dcm")
    (export / "linked_dir").symlink_to(tmp_path / "outside", target_is_directory=True)  # os.walk: not followed
    out = tmp_path / "out"
    report = run_ingest("dicom", export, out, site_key=key, follow_links=follow, progress=False)
    accounted(report, out)
    assert report["rows_read"] == 5
    if follow:
        assert report["rows_kept"] == 5
    else:
        assert report["rows_kept"] == 4 and "symbolic link" in reasons_by_path(report)["linked.dcm"]
    assert_no_raw_ids(out, ["OTHER-SITE-MRN"])


def test_midrc_file_name_leaving_the_export_is_not_opened(tmp_path, key):
    from ..site_adapters.test_midrc import build_midrc_export

    root = tmp_path / "midrc"
    build_midrc_export(root)
    write_dicom(tmp_path / "outside.dcm", PatientID="OTHER-SITE-MRN")
    series = pd.read_csv(root / "cr_series_file.tsv", sep="\t", dtype=str, keep_default_na=False)
    series.loc[0, "*file_name"] = "../outside.dcm"
    series.to_csv(root / "cr_series_file.tsv", sep="\t", index=False)
    out = tmp_path / "out"
    report = run_ingest("midrc", root, out, site_key=key, progress=False)
    accounted(report, out)
    outside = [r for r in report["set_aside"] if r["reason"].startswith("image path outside")]
    assert len(outside) == 1 and outside[0]["file"] == "cr_series_file.tsv"
    assert_no_raw_ids(out, ["OTHER-SITE-MRN"])


def test_nih_image_index_escaping_the_export_is_set_aside(tmp_path, key):
    from ..site_adapters.test_nih import ROWS, write_export

    rows = list(ROWS) + [("../../outside.png", "No Finding", 0, 9, "40", "M", "PA")]
    root = write_export(tmp_path / "in", rows=rows)
    png(tmp_path / "outside.png")
    out = tmp_path / "out"
    report = run_ingest("nih", root, out, site_key=key, progress=False)
    accounted(report, out)
    assert reasons_by_path(report)["images/../../outside.png"].startswith("image path outside the export folder")


def test_chexpert_path_escaping_the_export_is_set_aside(tmp_path, key):
    from ..site_adapters.test_chexpert import RELEASE, TRAIN, row, write_export

    train = TRAIN + [{**row(7, 1, 1), "Path": f"{RELEASE}/train/patient00007/study1/../../../../../x.jpg"}]
    root = write_export(tmp_path / "in", train)
    out = tmp_path / "out"
    report = run_ingest("chexpert", root, out, site_key=key, progress=False)
    accounted(report, out)
    reasons = [r["reason"] for r in report["set_aside"]]
    assert len(reasons) == 1 and reasons[0].startswith("image path outside the export folder")


def test_mimic_files_folder_linked_out_of_the_export_needs_follow_links(tmp_path, key):
    from ..site_adapters.test_mimic import RELEASE, write_export

    root = write_export(tmp_path / "in")
    files = root / RELEASE / "files"
    files.rename(tmp_path / "elsewhere")
    files.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    report = run_ingest("mimic", root, tmp_path / "out", site_key=key, progress=False)
    assert report["rows_read"] == 8 and report["set_aside_by_reason"] == {"image path outside the export folder": 8}
    assert all("symbolic link" in r["reason"] for r in report["set_aside"])
    followed = run_ingest("mimic", root, tmp_path / "out2", site_key=key, follow_links=True, progress=False)
    accounted(followed, tmp_path / "out2")
    assert followed["rows_kept"] == 8


# --------------------------------------------------------------------------- 3. one image, one row


def _hardlink(tmp_path):
    a = png(tmp_path / "export" / "images" / "a.png", seed=5)
    (tmp_path / "export" / "images" / "b.png").hardlink_to(a)
    return "images/a.png", "images/b.png", "same file as"


def _symlink(tmp_path):
    png(tmp_path / "export" / "images" / "a.png", seed=5)
    (tmp_path / "export" / "images" / "b.png").symlink_to("a.png")
    return "images/a.png", "images/b.png", "same file as"


def _dot_dot(tmp_path):
    png(tmp_path / "export" / "images" / "a.png", seed=5)
    return "images/a.png", "images/../images/a.png", "duplicate row"


def _linked_folder(tmp_path):
    png(tmp_path / "export" / "store" / "a.png", seed=5)
    (tmp_path / "export" / "images").mkdir(parents=True, exist_ok=True)
    (tmp_path / "export" / "images" / "store").symlink_to(tmp_path / "export" / "store", target_is_directory=True)
    return "store/a.png", "images/store/a.png", "same file as"


@pytest.mark.parametrize("make", [_hardlink, _symlink, _dot_dot, _linked_folder],
                         ids=["hard link", "symbolic link", "dot-dot alias", "linked folder"])
@pytest.mark.parametrize("same_patient", [True, False], ids=["same patient", "two patients"])
def test_same_image_under_two_names_is_kept_once(tmp_path, make, same_patient):
    first, second, reason = make(tmp_path)
    export = tmp_path / "export"
    rows = [{"path": first, "pid": "p1", "edema": "1"}, {"path": second, "pid": "p1" if same_patient else "p2",
                                                         "edema": "1"}]
    rows += [{"path": f"images/x{i}.png", "pid": f"q{i}", "edema": str(i % 2)} for i in range(10)]
    for i in range(10):
        png(export / "images" / f"x{i}.png", seed=10 + i)
    pd.DataFrame(rows).to_csv(export / "data.csv", index=False)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"csv": "data.csv", "image": "path", "patient": "pid",
                                                     "classes": ["edema"], "labels": {"edema": "edema"}}))
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=tmp_path / "m.yaml", progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 11 and [r["row"] for r in report["set_aside"]] == [2]
    text = report["set_aside"][0]["reason"]
    assert reason in text and "row 1" in text
    if reason != "duplicate row":
        assert ("under another patient" in text) is (not same_patient)


def test_dicom_instance_copied_under_two_patients_lands_in_one_split_only(tmp_path, key):
    export = tmp_path / "export"
    uids = [write_dicom(export / "a" / f"f{i}.dcm", seed=i, PatientID=f"MRN-A{i}", StudyDescription="Effusion")
            for i in range(12)]
    # the same instance re-exported under another patient id (a merge gone wrong) and a plain copy
    write_dicom(export / "b" / "copy0.dcm", seed=0, PatientID="MRN-B0", SOPInstanceUID=uids[0]["sop"],
                StudyInstanceUID=uids[0]["study"], StudyDescription="Effusion")
    (export / "c").mkdir()
    (export / "c" / "copy1.dcm").write_bytes((export / "a" / "f1.dcm").read_bytes())
    out = tmp_path / "out"
    report = run_ingest("dicom", export, out, site_key=key, progress=False)
    accounted(report, out)
    reasons = reasons_by_path(report)
    assert report["rows_read"] == 14 and report["rows_kept"] == 12
    assert reasons["b/copy0.dcm"] == "duplicate image under another patient: same SOPInstanceUID as row 1 (a/f0.dcm)"
    assert reasons["c/copy1.dcm"].startswith("duplicate image: same SOPInstanceUID as row")
    frame = read_manifest(out / "dicom")
    assert frame.groupby("patient_id")["split"].nunique().max() == 1 and len(frame) == 12
    assert_no_raw_ids(out, [u["sop"] for u in uids] + ["MRN-A", "MRN-B"])
