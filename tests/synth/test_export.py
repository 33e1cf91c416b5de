"""Synthetic exports: native formats match the real ones, same seed → same bytes, and every
hospital goes through its real adapter (``run_ingest``) with nothing set aside."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedcxr.synth import SYNTH_JSON, ingest_synthetic, write_synthetic_export
from fedcxr.synth.export import CHEXPERT_HEADER, NIH_HEADER, NIH_NAMES, NIH_NO_FINDING
from fedcxr.synth.hospitals import HOSPITALS, cohort
from fedcxr.vocab import AUX_VOCAB, label_column, raw_column

N, SIZE, SEED = 40, 32, 3


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    write_synthetic_export(out, images_per_site=N, image_size=SIZE, seed=SEED)
    return out


@pytest.fixture(scope="module")
def spec(export) -> dict:
    return json.loads((export / SYNTH_JSON).read_text())


def all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- synth.json, determinism


def test_synth_json_describes_every_hospital(export, spec):
    assert list(spec["hospitals"]) == ["nih_style", "chexpert_style", "midrc_style", "dicom_style"]
    sources = {name: h["source"] for name, h in spec["hospitals"].items()}
    assert sources == {"nih_style": "nih", "chexpert_style": "chexpert", "midrc_style": "midrc",
                       "dicom_style": "dicom"}
    for name, h in spec["hospitals"].items():
        assert h["images"] == N and (export / h["input"]).is_dir()
        assert h["ingest_kwargs"]["site_name"] == name and "--site-name" in h["ingest_args"]
        assert set(h["positives"]) == set(h["classes"])
    assert spec["hospitals"]["midrc_style"]["classes"] == ["covid19"]
    assert "lung_opacity" in spec["hospitals"]["chexpert_style"]["classes"]
    assert "hernia" in spec["hospitals"]["nih_style"]["classes"]  # class heterogeneity


def test_same_seed_gives_identical_bytes_and_another_seed_does_not(export, tmp_path):
    again = tmp_path / "again"
    write_synthetic_export(again, images_per_site=N, image_size=SIZE, seed=SEED)
    first, second = all_files(export), all_files(again)
    assert first.keys() == second.keys()
    different = [name for name in first if first[name] != second[name]]
    assert different == []
    other = tmp_path / "other"
    write_synthetic_export(other, sites=["nih_style"], images_per_site=N, image_size=SIZE, seed=SEED + 1)
    a = (export / "nih_style/Data_Entry_2017_v2020.csv").read_bytes()
    assert a != (other / "nih_style/Data_Entry_2017_v2020.csv").read_bytes()


def test_rewriting_replaces_a_hospital_folder(tmp_path):
    write_synthetic_export(tmp_path, sites=["nih_style"], images_per_site=12, image_size=SIZE)
    (tmp_path / "nih_style/images/stale.png").write_bytes(b"x")
    write_synthetic_export(tmp_path, sites=["nih_style"], images_per_site=6, image_size=SIZE)
    assert len(list((tmp_path / "nih_style/images").iterdir())) == 6


def test_bad_arguments_are_user_errors(tmp_path):
    from fedcxr.errors import UserError

    with pytest.raises(UserError, match="unknown synthetic hospital"):
        write_synthetic_export(tmp_path, sites=["mayo_style"])
    with pytest.raises(UserError, match="images-per-site"):
        write_synthetic_export(tmp_path, images_per_site=0)


# --------------------------------------------------------------------------- NIH


def test_nih_metadata_has_the_real_header_and_vocabularies(export, shared_data):
    text = (export / "nih_style/Data_Entry_2017_v2020.csv").read_text()
    header = text.split("\n", 1)[0]
    real = (shared_data / "nih-chestxray14/Data_Entry_rows_for_included_images.csv").read_text().split("\n", 1)[0]
    assert header == NIH_HEADER == real.strip()
    df = pd.read_csv(export / "nih_style/Data_Entry_2017_v2020.csv")
    assert len(df.columns) == 11 and len(df) == N  # the bracketed names split, as in the release
    tokens = {t for labels in df["Finding Labels"] for t in labels.split("|")}
    assert tokens <= set(NIH_NAMES.values()) | {NIH_NO_FINDING}
    assert NIH_NO_FINDING in tokens and "Effusion" in tokens
    assert not any(NIH_NO_FINDING in s and "|" in s for s in df["Finding Labels"])
    assert set(df["Patient Gender"]) <= {"M", "F"} and set(df["View Position"]) <= {"PA", "AP"}
    assert df["Patient Age"].dtype.kind == "i"
    assert re.fullmatch(r"\d{8}_\d{3}\.png", df["Image Index"].iloc[0])


def test_nih_images_lists_and_quirks(export):
    root = export / "nih_style"
    df = pd.read_csv(root / "Data_Entry_2017_v2020.csv")
    modes = {p.name: Image.open(p).mode for p in (root / "images").iterdir()}
    assert set(modes) == set(df["Image Index"])
    assert sorted(modes.values()).count("RGBA") == 1 and set(modes.values()) == {"L", "RGBA"}
    lists = {}
    for name in ("train_val_list.txt", "test_list.txt"):
        text = (root / name).read_text()
        assert not text.endswith("\n")  # as released
        lists[name] = set(text.split())
    assert lists["train_val_list.txt"] | lists["test_list.txt"] == set(df["Image Index"])
    patients = {k: {n.split("_")[0] for n in v} for k, v in lists.items()}
    assert patients["test_list.txt"] and not patients["test_list.txt"] & patients["train_val_list.txt"]
    assert list(df["Image Index"]) != sorted(df["Image Index"])  # v2020: not sorted by image


# --------------------------------------------------------------------------- CheXpert


def schemas_chexpert_header(shared_data: Path) -> list[str]:
    text = (shared_data / "SCHEMAS.md").read_text()
    section = text.split("### Header (19 columns)", 1)[1].split("###", 1)[0]
    quoted = re.search(r"`([^`]+)`", section, re.S).group(1)
    return [c.strip() for c in quoted.replace("\n", " ").split(",")]


def test_chexpert_csvs_match_the_release_format(export, shared_data):
    root = export / "chexpert_style/CheXpert-v1.0-small"
    assert CHEXPERT_HEADER == schemas_chexpert_header(shared_data)
    train, valid = pd.read_csv(root / "train.csv"), pd.read_csv(root / "valid.csv")
    assert list(train.columns) == list(valid.columns) == CHEXPERT_HEADER
    assert len(train) + len(valid) == N and len(valid) > 0
    labels = CHEXPERT_HEADER[5:]
    values = set(np.unique(train[labels].to_numpy().ravel().astype(str)))
    assert values == {"1.0", "0.0", "-1.0", "nan"}  # positive, negative, uncertain, not mentioned
    assert set(train["No Finding"].dropna()) == {1.0}  # never 0 or -1 in train
    assert set(np.unique(valid[labels].to_numpy())) <= {0.0, 1.0}  # consensus labels
    assert train["Path"].str.startswith("CheXpert-v1.0-small/train/patient").all()
    assert valid["Path"].str.startswith("CheXpert-v1.0-small/valid/patient").all()
    frames = pd.concat([train, valid])
    lateral = frames["Frontal/Lateral"] == "Lateral"
    assert lateral.any() and frames.loc[lateral, "AP/PA"].isna().all()
    assert set(frames.loc[~lateral, "AP/PA"]) <= {"AP", "PA"}
    assert set(frames["Sex"]) <= {"Male", "Female", "Unknown"} and frames["Age"].max() <= 90
    assert frames["Path"].str.contains(r"/patient\d{5}/study\d+/view\d_(?:frontal|lateral)\.jpg$").all()
    for rel in frames["Path"]:
        assert Image.open(export / "chexpert_style" / rel).format == "JPEG"
    number = lambda s: s.str.extract(r"patient(\d+)")[0].astype(int)  # noqa: E731
    assert number(valid["Path"]).min() > number(train["Path"]).max()


def test_chexpert_demographics_sheet(export):
    demo = pd.read_csv(export / "chexpert_style/CHEXPERT DEMO.csv")
    assert list(demo.columns) == ["PATIENT", "GENDER", "AGE_AT_CXR", "PRIMARY_RACE", "ETHNICITY"]
    assert demo["PATIENT"].str.fullmatch(r"patient\d{5}").all() and demo["PATIENT"].is_unique
    assert demo["PRIMARY_RACE"].nunique() >= 3


# --------------------------------------------------------------------------- round trips


def codes(series: pd.Series) -> Counter:
    return Counter(None if pd.isna(v) else int(v) for v in series)


def ingest_one(export: Path, spec: dict, name: str, out: Path, **kwargs) -> tuple[dict, pd.DataFrame]:
    from fedcxr.site_adapters.ingest import run_ingest
    from fedcxr.site_adapters.manifest import read_manifest

    info = spec["hospitals"][name]
    options = dict(info["ingest_kwargs"])
    if "labels_csv" in options:
        options["labels_csv"] = export / options["labels_csv"]
    report = run_ingest(info["source"], export / info["input"], out, progress=False, **options, **kwargs)
    return report, read_manifest(out / name)


@pytest.mark.parametrize("name, module", [
    ("nih_style", "fedcxr.site_adapters.nih"),
    ("chexpert_style", "fedcxr.site_adapters.chexpert"),
    ("midrc_style", "fedcxr.site_adapters.midrc"),
    ("dicom_style", "fedcxr.site_adapters.dicom_folder"),
])
def test_each_hospital_round_trips_through_its_adapter(export, spec, tmp_path, name, module):
    pytest.importorskip(module)
    report, manifest = ingest_one(export, spec, name, tmp_path, verify_pixels=True)
    info = spec["hospitals"][name]
    assert report["rows_read"] == report["rows_kept"] == N, report["set_aside"]
    assert list(report["sites"]) == [name]
    assert set(report["sites"][name]["class_set"]) == set(info["classes"])
    for cls, count in info["positives"].items():
        assert int((manifest[raw_column(cls)] == 1).sum()) == count, cls
    assert {"train", "test"} <= set(manifest["split"])
    assert manifest["aux__sex"].notna().mean() > 0.9 and manifest["aux__age_bin"].notna().mean() > 0.9
    assert manifest["aux__view"].notna().mean() > 0.9
    draws = cohort(HOSPITALS[name], N, SEED)
    if name in ("chexpert_style", "midrc_style"):  # race (and MIDRC's ethnicity) decode to the truth
        assert codes(manifest["aux__race"]) == Counter(
            AUX_VOCAB["race"].index(d.patient.race) if d.patient.race else None for d in draws)
    if name != "dicom_style":  # dicom_style leaves a few ViewPosition tags blank on purpose
        assert codes(manifest["aux__view"]) == Counter(AUX_VOCAB["view"].index(d.subject.view) for d in draws)
    if name == "nih_style":
        assert codes(manifest["aux__sex"]) == Counter(AUX_VOCAB["sex"].index(d.patient.sex) for d in draws)
    labeled = manifest[[label_column(c) for c in info["classes"]]].notna().any(axis=1).mean()
    assert labeled > 0.95


def test_ingest_synthetic_gives_one_site_per_hospital(export, tmp_path):
    for module in ("nih", "chexpert", "midrc", "dicom_folder"):
        pytest.importorskip(f"fedcxr.site_adapters.{module}")
    sites = ingest_synthetic(export, tmp_path / "manifests")
    assert set(sites) == {"nih_style", "chexpert_style", "midrc_style", "dicom_style"}
    for name, site_dir in sites.items():
        assert site_dir == tmp_path / "manifests" / name
        for file in ("manifest.parquet", "site.json", "ingest_report.json"):
            assert (site_dir / file).is_file(), (name, file)
        site = json.loads((site_dir / "site.json").read_text())
        root = Path(site.get("export_root", export / name))
        manifest = pd.read_parquet(site_dir / "manifest.parquet")
        assert all((root / p).is_file() for p in manifest["image_path"])
    assert not (tmp_path / "manifests" / "ingest_report.json").exists()


def test_cli_synth_writes_the_export_and_rejects_unknown_sites(tmp_path, capsys):
    from fedcxr.cli import main

    assert main(["synth", "--out", str(tmp_path), "--sites", "nih_style", "--images-per-site", "5",
                 "--image-size", "24"]) == 0
    assert "fedcxr ingest nih --input" in capsys.readouterr().out
    assert json.loads((tmp_path / SYNTH_JSON).read_text())["hospitals"]["nih_style"]["images"] == 5
    assert main(["synth", "--out", str(tmp_path), "--sites", "nope"]) == 2
    capsys.readouterr()
    # JPEG 2000 DICOM hospitals below the encoder's minimum: exit 2 naming them, no traceback
    assert main(["synth", "--out", str(tmp_path / "small"), "--sites", "dicom_style", "--image-size", "24"]) == 2
    err = capsys.readouterr().err
    assert "dicom_style" in err and "JPEG 2000" in err


def test_demographics_mode_is_chosen_for_every_hospital_and_recorded(tmp_path):
    """The default export takes NIH's effects (synth version 2); ``legacy`` writes version 1's findings
    for the same patients; an unknown mode is an exit-2 error naming it."""
    from fedcxr.errors import UserError
    from fedcxr.synth import SYNTH_VERSION

    default = write_synthetic_export(tmp_path / "a", sites=["nih_style"], images_per_site=60, image_size=24, seed=5)
    legacy = write_synthetic_export(tmp_path / "b", sites=["nih_style"], images_per_site=60, image_size=24, seed=5,
                                    demographics="legacy")
    assert default["synth_version"] == SYNTH_VERSION == 2
    assert default["hospitals"]["nih_style"]["demographics"] == "nih"
    assert legacy["hospitals"]["nih_style"]["demographics"] == "legacy"
    a = pd.read_csv(tmp_path / "a" / "nih_style" / "Data_Entry_2017_v2020.csv")
    b = pd.read_csv(tmp_path / "b" / "nih_style" / "Data_Entry_2017_v2020.csv")
    same = ["Image Index", "Patient ID", "Patient Age", "Patient Gender", "View Position"]
    pd.testing.assert_frame_equal(a[same], b[same])
    assert (a["Finding Labels"] != b["Finding Labels"]).any()
    with pytest.raises(UserError, match="demographics 'nhi'"):
        write_synthetic_export(tmp_path / "c", sites=["nih_style"], images_per_site=5, image_size=24, demographics="nhi")
