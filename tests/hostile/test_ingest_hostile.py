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

from fedcxr.site_adapters.base import IngestError
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
    assert site["manifest_version"] >= 2 and site["pseudonyms"]["key_id"] == secret.key_id  # keyed since v2
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


def test_synthetic_exports_get_a_fixed_key_so_splits_repeat_on_every_machine(tmp_path):
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    write_synthetic_export(tmp_path / "export", sites=["nih_style", "chexpert_style"], images_per_site=24,
                           image_size=32, seed=3)
    frames = []
    for name in ("a", "b"):
        sites = ingest_synthetic(tmp_path / "export", tmp_path / name)
        frames.append({s: read_manifest(d)[["image_key", "patient_id", "split"]] for s, d in sites.items()})
        assert not (tmp_path / name / KEY_FILE_NAME).exists()  # no secret needed, none written
        assert all((d / "set_aside.csv").is_file() for d in sites.values())
    assert all(frames[0][s].equals(frames[1][s]) for s in frames[0])


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
    report = run_ingest("dicom", export, out, labels_csv=tmp_path / "labels.csv", site_key=key, progress=False,
                        keep_non_chest=True)
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
    with pytest.raises(IngestError, match="no row kept: all 8 row"):
        run_ingest("mimic", root, tmp_path / "out", site_key=key, progress=False)
    report = json.loads((tmp_path / "out" / "ingest_report.json").read_text())
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


# --------------------------------------------------------------------------- 4. bounded memory


def _declared_dicom(path: Path, rows: int, cols: int, frames: int = 1, samples: int = 1) -> Path:
    """A small real DICOM whose header is rewritten to declare a huge image (pixel data stays tiny)."""
    write_dicom(path, PatientID="P-BIG", StudyDescription="No Finding")
    ds = pydicom.dcmread(path)
    ds.Rows, ds.Columns = rows, cols
    if frames > 1:
        ds.NumberOfFrames = frames
    if samples > 1:
        ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = samples, "RGB", 0
    ds.save_as(path)
    return path


def _png_bomb(path: Path, width: int, height: int) -> Path:
    """A structurally valid PNG (IHDR with good CRC, IDAT, IEND) declaring width × height."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
                     + chunk(b"IEND", b""))
    return path


def _jpeg_bomb(path: Path, width: int, height: int) -> Path:
    """A small real JPEG whose SOF0 frame header is patched to declare width × height."""
    import io

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16), dtype=np.uint8), "L").save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(data))
    return path


BOMBS = {
    "dicom 60000x60000": lambda p: _declared_dicom(p / "bomb.dcm", 60000, 60000),
    "dicom 1000x1000x200 frames": lambda p: _declared_dicom(p / "bomb.dcm", 1000, 1000, frames=200),
    "dicom rgb 6000x6000x3": lambda p: _declared_dicom(p / "bomb.dcm", 6000, 6000, samples=3),
    "png 20000x20000": lambda p: _png_bomb(p / "bomb.png", 20000, 20000),
    "jpeg 60000x60000": lambda p: _jpeg_bomb(p / "bomb.jpg", 60000, 60000),
    "jpeg 12000x12000": lambda p: _jpeg_bomb(p / "bomb.jpg", 12000, 12000),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
@pytest.mark.parametrize("decode", [False, True], ids=["headers", "--verify-pixels"])
def test_huge_declared_images_are_set_aside_before_any_decode(tmp_path, name, decode):
    export = tmp_path / "export"
    bomb = BOMBS[name](export / "images")
    assert bomb.stat().st_size < 8_000  # a few KB on disk, gigabytes if decoded
    rows = [{"path": f"images/ok{i}.png", "pid": f"p{i}", "edema": str(i % 2)} for i in range(6)]
    for i in range(6):
        png(export / "images" / f"ok{i}.png", seed=i)
    rows.append({"path": f"images/{bomb.name}", "pid": "p-bomb", "edema": "1"})
    pd.DataFrame(rows).to_csv(export / "data.csv", index=False)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"csv": "data.csv", "image": "path", "patient": "pid",
                                                     "classes": ["edema"], "labels": {"edema": "edema"}}))
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=tmp_path / "m.yaml", verify_pixels=decode, progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 6
    reason = reasons_by_path(report)[f"images/{bomb.name}"]
    assert reason.startswith("image too large"), reason


def test_dicom_folder_bomb_is_set_aside_naming_its_size(tmp_path, key):
    export = tmp_path / "export"
    for i in range(4):
        write_dicom(export / f"f{i}.dcm", seed=i, PatientID=f"P{i}", StudyDescription="No Finding")
    _declared_dicom(export / "bomb.dcm", 60000, 60000)
    assert (export / "bomb.dcm").stat().st_size < 6_500
    out = tmp_path / "out"
    report = run_ingest("dicom", export, out, site_key=key, verify_pixels=True, progress=False)
    accounted(report, out)
    assert reasons_by_path(report)["bomb.dcm"] == (
        "image too large: header declares 60000x60000 = 3,600,000,000 values, more than --max-pixels 100,000,000")


def test_max_pixels_option_bounds_ingest_and_is_kept_for_training(tmp_path):
    export = tmp_path / "export"
    rows = []
    for i in range(8):
        size = 16 if i % 2 else 24  # 256 or 576 pixels
        png(export / "images" / f"x{i}.png", size=size, seed=i)
        rows.append({"path": f"images/x{i}.png", "pid": f"p{i}", "edema": str(i % 2)})
    pd.DataFrame(rows).to_csv(export / "data.csv", index=False)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"csv": "data.csv", "image": "path", "patient": "pid",
                                                     "classes": ["edema"], "labels": {"edema": "edema"}}))
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=tmp_path / "m.yaml", max_pixels=300, progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 4 and report["set_aside_by_reason"] == {"image too large": 4}
    assert json.loads((out / "csv" / "site.json").read_text())["options"]["max_pixels"] == 300


def test_training_decode_refuses_an_image_over_the_sites_bound(tmp_path):
    from fedcxr.errors import UserError
    from fedcxr.pipeline.data import cache_images, load_site

    export = tmp_path / "export"
    rows = []
    for i in range(6):
        png(export / "images" / f"x{i}.png", size=16, seed=i)
        rows.append({"path": f"images/x{i}.png", "pid": f"p{i}", "edema": str(i % 2)})
    pd.DataFrame(rows).to_csv(export / "data.csv", index=False)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"csv": "data.csv", "image": "path", "patient": "pid",
                                                     "classes": ["edema"], "labels": {"edema": "edema"}}))
    run_ingest("csv", export, tmp_path / "out", mapping=tmp_path / "m.yaml", max_pixels=300, progress=False)
    # after ingest, one image is swapped for a much larger one (or a bomb) in the export
    _png_bomb(export / "images" / "x3.png", 30000, 30000)
    site = load_site(tmp_path / "out" / "csv")
    with pytest.raises(UserError, match=r"x3\.png.*image too large"):
        cache_images(site, 8, tmp_path / "cache", progress=False)
    png(export / "images" / "x3.png", size=24, seed=3)  # 576 > 300: the site's own bound holds
    with pytest.raises(UserError, match=r"x3\.png.*more than --max-pixels 300"):
        cache_images(site, 8, tmp_path / "cache", progress=False)


# --------------------------------------------------------------------------- 5. messages, not tracebacks


def cli(argv, capsys) -> tuple[int, str]:
    from fedcxr.cli import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def _non_utf8(folder: Path, name: bytes) -> Path:
    """A path whose file name is not valid UTF-8 (as a Latin-1 export writes ``é``)."""
    import os

    folder.mkdir(parents=True, exist_ok=True)
    return Path(os.fsdecode(os.path.join(os.fsencode(folder), name)))


def test_dicom_files_with_non_utf8_names_are_set_aside_not_crashing(tmp_path, key):
    export = tmp_path / "export"
    for i in range(4):
        write_dicom(export / f"f{i}.dcm", seed=i, PatientID=f"P{i}", StudyDescription="No Finding")
    write_dicom(_non_utf8(export, b"ren\xe9.dcm"), seed=7, PatientID="P7", StudyDescription="No Finding")
    write_dicom(_non_utf8(export, b"caf\xe9") / "x.dcm", seed=8, PatientID="P8", StudyDescription="No Finding")
    out = tmp_path / "out"
    report = run_ingest("dicom", export, out, site_key=key, progress=False)
    accounted(report, out)
    assert report["rows_read"] == 6 and report["rows_kept"] == 4
    on_disk = json.loads((out / "ingest_report.json").read_text(encoding="utf-8"))
    reasons = sorted(r["reason"] for r in on_disk["set_aside"])
    assert reasons == ["image path is not valid UTF-8: 'caf\\\\xe9/x.dcm'", "image path is not valid UTF-8: 'ren\\\\xe9.dcm'"]
    listed = (out / "set_aside.csv").read_bytes().decode("utf-8")  # strict UTF-8: no raw bytes written
    assert "ren\\xe9.dcm" in listed


@pytest.mark.parametrize("source", ["csv", "nih", "midrc"])
def test_stray_non_utf8_file_beside_the_images_is_harmless(tmp_path, key, source):
    out = tmp_path / "out"
    if source == "csv":
        export, mapping = write_csv_export(tmp_path, csv_rows(12), MAPPING)
        _non_utf8(export / "images", b"\xff\xfe.png").write_bytes(b"junk")
        report = run_ingest("csv", export, out, mapping=mapping, site_key=key, progress=False)
        assert report["rows_kept"] == 12
    elif source == "nih":
        from ..site_adapters.test_nih import write_export

        export = write_export(tmp_path / "in")
        _non_utf8(export / "images", b"0000\xff.png").write_bytes(b"junk")
        report = run_ingest("nih", export, out, site_key=key, progress=False)
        assert report["rows_kept"] > 0
    else:
        from ..site_adapters.test_midrc import build_midrc_export

        export = tmp_path / "midrc"
        build_midrc_export(export)
        write_dicom(_non_utf8(export / "images", b"loose\xe9.dcm"), PatientID="C-001")
        report = run_ingest("midrc", export, out, site_key=key, progress=False)
        assert any(r["reason"].startswith("image path is not valid UTF-8") for r in report["set_aside"])
    accounted(report, out)


BAD_TABLES = {
    "empty file": (b"", "empty file: no header row"),
    "blank first line": (b"\n\n", "empty file: no header row"),
    "header only": (b"image,pid,study,edema\n", "header row only, no data rows"),
    "repeated column": (b"image,pid,study,edema,edema\nim0,p,s,1,0\n", "'edema' appear more than once"),
    "not utf-8": ("image,pid,study,edema\nim0,Jos\xe9,s,1\n".encode("latin-1"), "cannot read"),
}


@pytest.mark.parametrize("name", sorted(BAD_TABLES))
def test_bad_csv_stops_with_exit_2_naming_the_file(tmp_path, capsys, name):
    content, message = BAD_TABLES[name]
    export, mapping = write_csv_export(tmp_path, csv_rows(4), MAPPING)
    (export / "data.csv").write_bytes(content)
    code, err = cli(["ingest", "csv", "--input", export, "--mapping", mapping, "--out", tmp_path / "out", "-q"], capsys)
    assert code == 2 and "data.csv" in err and message in err and "Traceback" not in err


@pytest.mark.parametrize("source, content, message", [
    ("nih", b"", "empty file: no header row"),
    ("nih", b"Image Index,Finding Labels,Patient ID,Patient ID\n", "'Patient ID' appear more than once"),
    ("dicom-labels", b"file,edema,edema\nf0.dcm,1,1\n", "'edema' appear more than once"),
    ("dicom-labels", b"", "empty file: no header row"),
    ("midrc", b"", "empty file: no header row"),
])
def test_bad_metadata_tables_of_other_sources_exit_2(tmp_path, capsys, source, content, message):
    if source == "nih":
        from ..site_adapters.test_nih import write_export

        export = write_export(tmp_path / "in")
        (export / "Data_Entry_2017.csv").write_bytes(content)
        argv = ["ingest", "nih", "--input", export]
    elif source == "dicom-labels":
        export = tmp_path / "export"
        write_dicom(export / "f0.dcm", PatientID="P0")
        (tmp_path / "labels.csv").write_bytes(content)
        argv = ["ingest", "dicom", "--input", export, "--labels", tmp_path / "labels.csv"]
    else:
        from ..site_adapters.test_midrc import build_midrc_export

        export = tmp_path / "midrc"
        build_midrc_export(export)
        (export / "case.tsv").write_bytes(content)
        argv = ["ingest", "midrc", "--input", export]
    code, err = cli(argv + ["--out", tmp_path / "out", "-q"], capsys)
    assert code == 2 and message in err and "Traceback" not in err, err


def _patch_dicom(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    path.write_bytes(data.replace(old, new))


def _bad_slope(p):
    write_dicom(p, PatientID="PB", RescaleSlope="1.25", RescaleIntercept="0")
    _patch_dicom(p, b"1.25", b"abcd")
    return "unusable Modality LUT: RescaleSlope 'abcd' is not a number"


def _bad_intercept(p):
    write_dicom(p, PatientID="PB", RescaleSlope="1", RescaleIntercept="-1024")
    _patch_dicom(p, b"-1024", b"1e999")
    return "unusable Modality LUT: RescaleIntercept is inf"


def _zero_slope(p):
    write_dicom(p, PatientID="PB", RescaleSlope="0", RescaleIntercept="0")
    return "unusable Modality LUT: RescaleSlope is 0"


def _broken_lut(p):
    from pydicom.sequence import Sequence

    item = Dataset()
    item.LUTDescriptor = [4096, 0, 16]
    item.ModalityLUTType = "US"
    item.LUTData = b"\x00\x01"  # one entry where 4096 are declared
    write_dicom(p, PatientID="PB", ModalityLUTSequence=Sequence([item]))
    return "unusable Modality LUT Sequence"


@pytest.mark.parametrize("make", [_bad_slope, _bad_intercept, _zero_slope, _broken_lut],
                         ids=["slope abcd", "intercept inf", "slope 0", "LUT too short"])
def test_unusable_modality_lut_is_set_aside_at_the_header_check(tmp_path, key, make):
    export = tmp_path / "export"
    for i in range(4):
        write_dicom(export / f"f{i}.dcm", seed=i, PatientID=f"P{i}", StudyDescription="No Finding")
    expected = make(export / "bad.dcm")
    pd.DataFrame({"file": [f"f{i}.dcm" for i in range(4)] + ["bad.dcm"], "edema": [0, 1, 0, 1, 1]}).to_csv(
        tmp_path / "labels.csv", index=False)
    out = tmp_path / "out"
    report = run_ingest("dicom", export, out, labels_csv=tmp_path / "labels.csv", site_key=key, progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 4 and reasons_by_path(report)["bad.dcm"].startswith(expected)


def test_ingest_that_keeps_no_row_exits_2_and_says_why(tmp_path, capsys):
    rows = csv_rows(6)
    export, mapping = write_csv_export(tmp_path, rows, MAPPING, missing_images=tuple(r["image"] for r in rows))
    out = tmp_path / "out"
    code, err = cli(["ingest", "csv", "--input", export, "--mapping", mapping, "--out", out, "-q"], capsys)
    assert code == 2 and "no row kept: all 6 row(s) read were set aside (6 missing file)" in err
    assert "set_aside.csv" in err and "Traceback" not in err
    listed = pd.read_csv(out / "set_aside.csv", dtype=str)
    assert len(listed) == 6 and set(listed["reason"]) == {"missing file"}
    assert not list(out.glob("*/manifest.parquet"))


@pytest.mark.parametrize("kind", ["png", "dicom"])
def test_constant_images_are_set_aside_when_pixels_are_verified(tmp_path, key, kind):
    export = tmp_path / "export"
    rows = []
    for i in range(6):
        name = f"x{i}.{'png' if kind == 'png' else 'dcm'}"
        flat = i == 2
        if kind == "png":
            png(export / "images" / name, seed=i, value=128 if flat else None)
        else:
            write_dicom(export / "images" / name, seed=i, PatientID=f"P{i}",
                        pixels=np.full((16, 16), 700) if flat else None)
        rows.append({"path": f"images/{name}", "pid": f"p{i}", "edema": str(i % 2)})
    pd.DataFrame(rows).to_csv(export / "data.csv", index=False)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"csv": "data.csv", "image": "path", "patient": "pid",
                                                     "classes": ["edema"], "labels": {"edema": "edema"}}))
    out = tmp_path / "out"
    report = run_ingest("csv", export, out, mapping=tmp_path / "m.yaml", verify_pixels=True, site_key=key,
                        progress=False)
    accounted(report, out)
    assert report["rows_kept"] == 5
    assert reasons_by_path(report) == {f"images/x2.{'png' if kind == 'png' else 'dcm'}":
                                       "constant image: every pixel has the same value"}


def test_manifest_written_before_keyed_pseudonyms_is_refused_with_a_message(tmp_path, capsys):
    from fedcxr.errors import UserError
    from fedcxr.pipeline.data import load_site

    export, mapping = write_csv_export(tmp_path, csv_rows(12), MAPPING)
    run_ingest("csv", export, tmp_path / "out", mapping=mapping, progress=False)
    site_json = tmp_path / "out" / "csv" / "site.json"
    meta = json.loads(site_json.read_text())
    meta["manifest_version"] = 1  # as fedcxr wrote it when ids were the export's own
    site_json.write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"site.json: manifest_version 1 .*run `fedcxr ingest` again"):
        load_site(tmp_path / "out" / "csv")
