"""``run_ingest``: bad input, accounting of every row, sites without labels, re-runs (csv fixtures)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedcxr.site_adapters.base import IngestError
from fedcxr.site_adapters.ingest import ADAPTERS, run_ingest
from fedcxr.site_adapters.manifest import read_manifest, read_site_json

MAPPING = {
    "image": {"column": "image", "prefix": "images", "extension": ".png"},
    "patient": "pid",
    "classes": ["edema", "covid19"],
    "labels": {"edema": "edema", "covid19": "covid"},
    "demographics": {"sex": "sex"},
    "groups": ["hospital"],
}


def _rows() -> list[dict]:
    """Hospitals A and B label their images; C labels nothing; a few rows are broken."""
    rows = []
    for i in range(30):
        hospital = "ABC"[i % 3]
        labeled = hospital != "C"
        rows.append({
            "image": f"im{i}", "pid": f"p{i // 2}", "hospital": hospital, "sex": "MF"[i % 2],
            "edema": ["1", "0", "-1"][(i // 3) % 3] if labeled else "", "covid": str(i % 2) if labeled else "",
        })
    rows.append({**rows[0], "pid": "p99"})                       # row 31: same image, another patient id
    rows.append({**rows[1], "image": "gone"})                    # row 32: image file missing
    rows.append({**rows[1], "image": "broken"})                  # row 33: not a PNG
    rows.append({**rows[1], "image": "im40", "edema": "7"})      # row 34: unmapped label value
    return rows


@pytest.fixture
def export(csv_export):
    input_dir, mapping = csv_export(_rows(), MAPPING, missing_images=("gone",))
    (input_dir / "images" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 40)
    return input_dir, mapping


def _ingest(export, out, **kwargs):
    input_dir, mapping = export
    return run_ingest("csv", input_dir, out, mapping=mapping, site_by="hospital", progress=False, **kwargs)


def test_every_row_is_kept_or_set_aside_with_a_reason(export, tmp_path):
    report = _ingest(export, tmp_path / "out")
    assert report["rows_read"] == 34
    assert report["rows_kept"] + report["rows_set_aside"] == report["rows_read"]
    assert report["rows_kept"] == 20 and set(report["sites"]) == {"A", "B"}
    reasons = {s["row"]: s["reason"] for s in report["set_aside"]}
    assert reasons[31] == "duplicate row: same image as row 1"
    assert reasons[32] == "missing file"
    assert reasons[33].startswith("corrupt PNG")
    assert reasons[34] == "unmapped label value: column 'edema' value '7'"
    site_c = [r for r, text in reasons.items() if text == "site 'C' has no labeled class"]
    assert len(site_c) == 10 and not (tmp_path / "out" / "C").exists()
    assert report["set_aside_by_reason"]["site 'C' has no labeled class"] == 10
    on_disk = json.loads((tmp_path / "out" / "ingest_report.json").read_text())
    assert on_disk["rows_set_aside"] == 14 and len(on_disk["set_aside"]) == 14
    assert all(set(s) == {"file", "row", "image_path", "reason", "site"} for s in on_disk["set_aside"])


def test_manifests_hold_canonical_rows(export, tmp_path):
    _ingest(export, tmp_path / "out")
    frame = pd.concat([read_manifest(tmp_path / "out" / s) for s in ("A", "B")])
    assert frame["image_path"].is_unique and frame.groupby("patient_id")["split"].nunique().max() == 1
    assert set(frame["site"]) == {"A", "B"} and set(frame["split"]) <= {"train", "val", "test"}
    assert frame["label__edema"].isna().sum() == (frame["raw__edema"] == -1).sum() > 0   # ignore → NaN
    assert frame["aux__sex"].notna().all()
    assert read_site_json(tmp_path / "out" / "A")["class_set"] == ["edema", "covid19"]


def test_uncertain_zeros_policy_reaches_the_manifest(export, tmp_path):
    _ingest(export, tmp_path / "out", uncertain="zeros")
    frame = read_manifest(tmp_path / "out" / "A")
    uncertain = frame["raw__edema"] == -1
    assert uncertain.any() and (frame.loc[uncertain, "label__edema"] == 0).all()
    assert read_site_json(tmp_path / "out" / "A")["options"]["uncertain"] == "zeros"


def test_rerun_into_the_same_out_is_safe_and_identical(export, tmp_path):
    out = tmp_path / "out"
    first = _ingest(export, out)
    hashes = {s: read_site_json(out / s)["content_hash"] for s in first["sites"]}
    second = _ingest(export, out)
    assert {s: read_site_json(out / s)["content_hash"] for s in second["sites"]} == hashes
    strip = lambda r: {k: v for k, v in r.items() if k not in {"seconds", "site_key"}}  # noqa: E731
    assert strip(first) == strip(second)
    assert first["site_key"]["created"] and not second["site_key"]["created"]     # the second reuses the key
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_one_image_under_two_patients_is_in_one_split_only(csv_export, tmp_path):
    rows = [{"image": f"im{i}", "pid": f"p{i}", "edema": "1", "covid": "0", "sex": "M", "hospital": "A"}
            for i in range(40)]
    rows += [{**rows[i], "pid": f"alias{i}"} for i in range(40)]   # every image again, new patient id
    input_dir, mapping = csv_export(rows, MAPPING)
    report = run_ingest("csv", input_dir, tmp_path / "out", mapping=mapping, progress=False)
    frame = read_manifest(tmp_path / "out" / "csv")
    assert len(frame) == 40 and frame["image_path"].is_unique
    assert not frame["patient_id"].str.startswith("alias").any()
    assert report["set_aside_by_reason"] == {"duplicate row": 40}


def test_unknown_source_lists_the_sources(tmp_path):
    with pytest.raises(IngestError) as info:
        run_ingest("pacs", tmp_path, tmp_path / "out")
    assert "unknown SOURCE 'pacs'" in str(info.value)
    assert all(name in str(info.value) for name in ADAPTERS)


def test_missing_input_folder(tmp_path):
    with pytest.raises(IngestError, match="no such directory"):
        run_ingest("csv", tmp_path / "absent", tmp_path / "out")


def test_missing_required_column_is_named(csv_export, tmp_path):
    rows = [{k: v for k, v in r.items() if k != "covid"} for r in _rows()]
    input_dir, mapping = csv_export(rows, MAPPING)
    with pytest.raises(IngestError, match="missing required column.*'covid'"):
        run_ingest("csv", input_dir, tmp_path / "out", mapping=mapping, progress=False)
    assert not (tmp_path / "out").exists()


def test_unknown_site_column_names_the_available_ones(export, tmp_path):
    input_dir, mapping = export
    with pytest.raises(IngestError, match="no such column; available: hospital"):
        run_ingest("csv", input_dir, tmp_path / "out", mapping=mapping, site_by="state", progress=False)


def test_verify_pixels_sets_aside_undecodable_images(csv_export, tmp_path):
    rows = [{"image": f"im{i}", "pid": f"p{i}", "edema": "1", "covid": "0", "sex": "F", "hospital": "A"}
            for i in range(4)]
    input_dir, mapping = csv_export(rows, MAPPING)
    png = input_dir / "images" / "im3.png"
    data = bytearray(png.read_bytes())
    data[40:60] = bytes(20)                                    # damage the compressed pixel stream
    png.write_bytes(bytes(data))
    header_only = run_ingest("csv", input_dir, tmp_path / "a", mapping=mapping, progress=False)
    decoded = run_ingest("csv", input_dir, tmp_path / "b", mapping=mapping, progress=False, verify_pixels=True)
    assert header_only["rows_kept"] == 4
    assert decoded["rows_kept"] == 3 and decoded["set_aside"][0]["row"] == 4
    assert np.isfinite(decoded["seconds"])


def test_every_adapter_declares_the_classes_it_labels():
    """One convention for all sources: ``SOURCE_CLASSES`` is a tuple of canonical classes (a fixed
    vocabulary) or ``None`` (the export decides: a mapping, a label csv, the .npz)."""
    import importlib

    from fedcxr.site_adapters.ingest import ADAPTERS
    from fedcxr.vocab import CLASSES

    for source, target in ADAPTERS.items():
        module = importlib.import_module(target.split(":")[0])
        declared = module.SOURCE_CLASSES
        assert declared is None or (isinstance(declared, tuple) and declared and set(declared) <= set(CLASSES)), source
        if declared is not None:
            assert list(declared) == [c for c in CLASSES if c in declared], f"{source}: not in canonical order"


# --------------------------------------------------------------------------- plan mode


def _strip(report: dict) -> dict:
    """The report without its timing, and (a site's copy) without the export-wide counts."""
    return {k: v for k, v in report.items() if k not in {"seconds", "site", "export"}}


def test_plan_predicts_the_ingest_without_opening_an_image(export, tmp_path):
    """Sites, splits and per-class counts of the plan are the ingest's; the plan never opens an image:
    with every image replaced by garbage, or removed, the plan is the same."""
    from fedcxr.site_adapters.ingest import PLAN_NAME, PLAN_SET_ASIDE_NAME

    input_dir, mapping = export
    key = tmp_path / "site.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o600)
    plan = run_ingest("csv", input_dir, tmp_path / "plan", mapping=mapping, site_by="hospital", progress=False,
                      site_key=key, plan=True)
    done = run_ingest("csv", input_dir, tmp_path / "done", mapping=mapping, site_by="hospital", progress=False,
                      site_key=key)
    assert plan["plan"] is True and plan["cannot_know"] and not (tmp_path / "plan" / "A").exists()
    assert json.loads((tmp_path / "plan" / PLAN_NAME).read_text()) == plan
    assert (tmp_path / "plan" / PLAN_SET_ASIDE_NAME).is_file()
    # The image check's set-asides (a missing file, a broken PNG) are what the plan cannot know:
    assert plan["rows_kept"] == done["rows_kept"] + 2 and set(plan["sites"]) == set(done["sites"]) == {"A", "B"}
    assert set(done["set_aside_by_reason"]) - set(plan["set_aside_by_reason"]) == {"missing file", "corrupt PNG header"}
    for site in ("A", "B"):
        written = read_site_json(tmp_path / "done" / site)
        planned = plan["sites"][site]
        assert planned["class_set"] == written["class_set"]
        gone = {"A": 0, "B": 2}[site]   # rows 32, 33 are hospital B's (the missing and the broken image)
        assert sum(planned["rows_per_split"].values()) == written["rows"] + gone
        if not gone:
            assert planned["rows_per_split"] == written["rows_per_split"]
            assert planned["class_counts"] == written["class_counts"]
    images = input_dir / "images"
    for png in images.iterdir():
        png.write_bytes(b"not an image at all")
    garbage = run_ingest("csv", input_dir, tmp_path / "plan2", mapping=mapping, site_by="hospital", progress=False,
                         site_key=key, plan=True)
    for png in images.iterdir():
        png.unlink()
    images.rmdir()
    removed = run_ingest("csv", input_dir, tmp_path / "plan3", mapping=mapping, site_by="hospital", progress=False,
                         site_key=key, plan=True)
    assert _strip(garbage) == _strip(plan) == _strip(removed)


def test_plan_is_refused_where_it_would_open_images(tmp_path):
    (tmp_path / "in").mkdir()
    with pytest.raises(IngestError, match="--plan: SOURCE 'dicom' keeps its metadata inside the images"):
        run_ingest("dicom", tmp_path / "in", tmp_path / "out", plan=True)
    with pytest.raises(IngestError, match="cannot --verify-pixels"):
        run_ingest("nih", tmp_path / "in", tmp_path / "out", plan=True, verify_pixels=True)


def test_plan_on_the_command_line(export, tmp_path, capsys):
    from fedcxr.cli import main

    input_dir, mapping = export
    assert main(["ingest", "csv", "--input", str(input_dir), "--mapping", str(mapping), "--out", str(tmp_path / "p"),
                 "--site-by", "hospital", "--plan", "-q"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("plan: read 34 rows: would keep 22, set aside 12")
    assert "no image opened and no manifest written" in printed


def test_a_plan_names_the_key_that_reproduces_it_and_an_ingest_says_it_made_a_new_one(csv_export, tmp_path, capsys):
    """A plan into one folder and an ingest into another: without the plan's key the ingest draws other
    sites (a new key, new pseudonyms); the plan names its key, the ingest says it created a new one, and
    the key the plan named reproduces the plan's sites and splits."""
    from fedcxr.cli import main

    rows = [{"image": f"im{i}", "pid": f"p{i}", "edema": str(i % 2), "covid": "0", "sex": "F", "hospital": "A"}
            for i in range(60)]
    input_dir, mapping = csv_export(rows, MAPPING)
    common = ["ingest", "csv", "--input", str(input_dir), "--mapping", str(mapping), "--site-by", "iid:3", "-q"]
    assert main(common + ["--out", str(tmp_path / "plan"), "--plan"]) == 0
    printed = capsys.readouterr()
    key_file = tmp_path / "plan" / ".fedcxr_site_key"
    assert f"--site-key {key_file}" in printed.out and "created by this run" in printed.out
    plan = json.loads((tmp_path / "plan" / "ingest_plan.json").read_text())
    assert plan["site_key"] == {"file": str(key_file), "key_id": plan["pseudonym_key_id"], "created": True}

    assert main(common + ["--out", str(tmp_path / "new")]) == 0
    printed = capsys.readouterr()
    assert f"site key {tmp_path / 'new' / '.fedcxr_site_key'} (created by this run" in printed.out
    assert "splits differ from any plan or ingest made with another key" in printed.out
    assert main(common + ["--out", str(tmp_path / "same"), "--site-key", str(key_file)]) == 0
    assert "created by this run" not in capsys.readouterr().out
    same = json.loads((tmp_path / "same" / "ingest_report.json").read_text())
    assert {s: i["rows_per_split"] for s, i in same["sites"].items()} == \
        {s: i["rows_per_split"] for s, i in plan["sites"].items()}
    assert same["site_key"]["created"] is False and same["pseudonym_key_id"] == plan["pseudonym_key_id"]


# --------------------------------------------------------------------------- one report per site


def test_a_second_ingest_into_the_same_out_keeps_the_first_sites_report(csv_export, tmp_path):
    from fedcxr.site_adapters.ingest import read_ingest_report

    rows = [{"image": f"im{i}", "pid": f"p{i}", "edema": str(i % 2), "covid": "0", "sex": "F", "hospital": "A"}
            for i in range(6)]
    input_dir, mapping = csv_export(rows, MAPPING, missing_images=("im5",))
    out = tmp_path / "out"
    first = run_ingest("csv", input_dir, out, mapping=mapping, site_name="hospital_a", progress=False)
    second = run_ingest("csv", input_dir, out, mapping=mapping, site_name="hospital_b", progress=False,
                        uncertain="zeros")
    on_disk = json.loads((out / "hospital_a" / "ingest_report.json").read_text())
    assert _strip(on_disk) == _strip(first) and on_disk["sites"].keys() == {"hospital_a"}
    assert (out / "hospital_a" / "set_aside.csv").read_text().count("missing file") == 1
    assert _strip(json.loads((out / "hospital_b" / "ingest_report.json").read_text())) == _strip(second)
    assert _strip(read_ingest_report(out, "hospital_a")) == _strip(first)
    assert json.loads((out / "ingest_report.json").read_text())["sites"].keys() == {"hospital_b"}   # the latest
    # An OUT written before per-site reports: only OUT/ingest_report.json, which lists the site.
    (out / "hospital_b" / "ingest_report.json").unlink()
    assert _strip(read_ingest_report(out, "hospital_b")) == _strip(second)
    with pytest.raises(IngestError, match="no ingest report lists site 'hospital_c'"):
        read_ingest_report(out, "hospital_c")


# --------------------------------------------------------------------------- missing files, named


def test_missing_images_name_the_path_tried_and_one_folder_deeper(csv_export, tmp_path):
    rows = [{"image": f"im{i}", "pid": f"p{i}", "edema": "1", "covid": "0", "sex": "F", "hospital": "A"}
            for i in range(4)]
    input_dir, mapping = csv_export(rows, MAPPING)
    deeper = input_dir / "images" / "images"   # the zip was unpacked into its own folder
    deeper.mkdir()
    for name in ("im1.png", "im2.png"):
        (input_dir / "images" / name).rename(deeper / name)
    (input_dir / "images" / "im3.png").unlink()
    report = run_ingest("csv", input_dir, tmp_path / "out", mapping=mapping, progress=False)
    reasons = {r["row"]: r["reason"] for r in report["set_aside"]}
    assert reasons == {2: "missing file: not at images/im1.png, but one folder deeper at images/images/im1.png",
                       3: "missing file: not at images/im2.png, but one folder deeper at images/images/im2.png",
                       4: "missing file"}
    assert report["set_aside_by_reason"] == {"missing file": 3}
    assert report["hints"][0] == (f"3 missing file(s): each was looked for at {input_dir.resolve()}/<image path> "
                                  f"(e.g. {input_dir.resolve() / 'images' / 'im1.png'})")
    assert "2 of 3 missing file(s) probed exist one folder deeper" in report["hints"][1]


def test_missing_input_and_metadata_files_say_where_they_are(csv_export, tmp_path):
    rows = [{"image": "im0", "pid": "p0", "edema": "1", "covid": "0", "sex": "F", "hospital": "A"}]
    input_dir, mapping = csv_export(rows, MAPPING)
    nested = tmp_path / "download"
    nested.mkdir()
    input_dir.rename(nested / "export")
    with pytest.raises(IngestError, match=r"no such directory \(but it exists one folder deeper: .*download/export\)"):
        run_ingest("csv", tmp_path / "export", tmp_path / "out", mapping=mapping)
    (nested / "export" / "sub").mkdir()
    (nested / "export" / "data.csv").rename(nested / "export" / "sub" / "data.csv")
    with pytest.raises(IngestError, match=r"data.csv: no such file \(mapping key 'csv'\) \(but it exists one folder "
                                          r"deeper: .*sub/data.csv\)"):
        run_ingest("csv", nested / "export", tmp_path / "out", mapping=mapping)


# --------------------------------------------------------------------------- set-aside rows, site by site


def test_each_site_folder_lists_only_its_own_set_aside_rows(export, tmp_path, capsys):
    """A bad hospital A row is listed in A's folder, never in B's; the root lists every row with its site
    (or none: rows whose site is not known are at the root only, and the command line says so)."""
    from fedcxr.cli import main

    input_dir, mapping = export
    out = tmp_path / "out"
    assert main(["ingest", "csv", "--input", str(input_dir), "--mapping", str(mapping), "--out", str(out),
                 "--site-by", "hospital", "-q"]) == 0
    root = json.loads((out / "ingest_report.json").read_text())
    site_of = {r["row"]: r["site"] for r in root["set_aside"]}
    assert len(site_of) == root["rows_set_aside"] == 14                     # the root: every row
    assert site_of[31] == "A" and site_of[32] == site_of[33] == "B"          # rows 1, 2 are A's, B's
    assert site_of[34] is None                                              # the adapter could not read it
    assert {site_of[r] for r, text in ((r["row"], r["reason"]) for r in root["set_aside"])
            if text.startswith("site 'C'")} == {None}                        # C was never written
    rows_a = pd.read_csv(out / "A" / "set_aside.csv")
    rows_b = pd.read_csv(out / "B" / "set_aside.csv")
    assert rows_a["row"].tolist() == [31] and sorted(rows_b["row"]) == [32, 33]
    assert len(pd.read_csv(out / "set_aside.csv")) == 14
    report_a = json.loads((out / "A" / "ingest_report.json").read_text())
    assert [r["row"] for r in report_a["set_aside"]] == [31] and set(report_a["sites"]) == {"A"}
    assert report_a["rows_kept"] + report_a["rows_set_aside"] == report_a["rows_read"]
    assert report_a["export"]["rows_read"] == 34 and report_a["export"]["rows_set_aside_without_site"] == 11
    assert read_site_json(out / "B")["set_aside"]["count"] == 2
    printed = capsys.readouterr().out
    assert "each site's folder lists its own (A 1, B 2)" in printed
    assert "11 whose site is not known" in printed and "only in" in printed


def test_set_aside_rows_follow_their_patient_when_sites_are_drawn(csv_export, tmp_path):
    """``iid:K``: a missing image's row goes where its patient's other images went."""
    rows = [{"image": f"im{i}", "pid": f"p{i // 2}", "edema": str(i % 2), "covid": "0", "sex": "F",
             "hospital": "A"} for i in range(20)]
    input_dir, mapping = csv_export(rows, MAPPING, missing_images=("im3",))
    out = tmp_path / "out"
    report = run_ingest("csv", input_dir, out, mapping=mapping, site_by="iid:2", progress=False)
    (aside,) = report["set_aside"]
    site_of_patient = read_manifest(out / aside["site"]).set_index("image_path")["site"]
    assert "images/im2.png" in site_of_patient.index                        # im2: the same patient, kept
    other = ({"site-1", "site-2"} - {aside["site"]}).pop()
    assert len(pd.read_csv(out / other / "set_aside.csv")) == 0
