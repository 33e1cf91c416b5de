"""``fedcxr predict``: a trained model on new images — keys, probabilities, decisions, no ids."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from fedcxr.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def few_scans(shared_data, tmp_path):
    """Three of ``scan_folder``'s real images (one DICOM, two PNGs), for the tests whose point is not
    the decoding of every DICOM flavour (that is test_predict_on_a_new_dicom_and_png_folder's): each
    ``fedcxr predict`` on all nine decodes ~8 MB of JPEG-LS/J2K DICOMs again."""
    folder = tmp_path / "few_scans"
    (folder / "dicom").mkdir(parents=True)
    shutil.copy(shared_data / "dicom" / "rsna_pneumonia_cr_chest_pa_jpegbaseline_mono2.dcm", folder / "dicom")
    pngs = sorted((shared_data / "hannover-covid-19-image-repository").rglob("*.png"))[:2]
    for i, png in enumerate(pngs):
        shutil.copy(png, folder / f"portable_{i}.png")
    return folder


def _snapshot(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*"))


def test_predict_on_a_new_dicom_and_png_folder(evaluated_run, scan_folder, tmp_path, capsys):
    before = _snapshot(scan_folder)
    out = tmp_path / "out" / "preds.csv"
    assert main(["predict", str(evaluated_run), "--input", str(scan_folder), "--out", str(out), "--device", "cpu",
                 "-q"]) == 0
    printed = capsys.readouterr().out
    # 8 real DICOMs (one a second copy of another's SOPInstanceUID: not scored twice) and 2 PNGs
    assert "scored 9 image(s) with the global model" in printed and "private-key-map.csv" in printed
    assert "1 file(s) not scored" in printed
    assert _snapshot(scan_folder) == before  # nothing written into the input

    preds = pd.read_csv(out, dtype={"key": str})
    classes = json.loads((evaluated_run / "run.json").read_text())["classes"]
    assert len(preds) == 9 and preds["key"].is_unique
    assert preds["not_chest_radiograph"].sum() == 2      # the hip and the dental film: scored, and flagged
    assert "2 image(s) are not chest radiographs" in printed
    assert [c for c in preds.columns if c.startswith("prob__")] == [f"prob__{c}" for c in classes]
    probs = preds[[f"prob__{c}" for c in classes]].to_numpy()
    assert np.isfinite(probs).all() and ((probs > 0) & (probs < 1)).all()
    first = classes[0]
    assert (preds[f"youden__{first}"] == (preds[f"prob__{first}"] >= 0.5).astype(int)).all()
    assert (preds[f"sens90__{first}"] == 1).all()
    assert preds[f"youden__{classes[-1]}"].isna().all()  # undefined on the tiny val split: no decision

    text = out.read_text()
    for path in scan_folder.rglob("*"):
        assert path.stem not in text  # no file name, no path in the shareable CSV
    key_map = pd.read_csv(out.with_name("preds.private-key-map.csv"), dtype={"key": str}, keep_default_na=False)
    scored = key_map.loc[key_map["status"] == "scored"]
    assert set(scored["key"]) == set(preds["key"])
    duplicate = key_map.loc[key_map["status"] != "scored"]
    assert len(duplicate) == 1 and duplicate["status"].iloc[0].startswith("not scored: duplicate image")
    assert set(key_map["image_path"]) == {str(p.relative_to(scan_folder).as_posix())
                                          for p in scan_folder.rglob("*") if p.is_file()}


def test_manifest_folder_scores_as_evaluate_does(evaluated_run, tiny_manifests, tmp_path):
    """Same preprocessing as training/evaluation: a site's test rows get evaluate's probabilities and keys."""
    out = tmp_path / "site.csv"
    assert main(["predict", str(evaluated_run), "--input", str(tiny_manifests / "dicom_style"), "--out", str(out),
                 "-q", "--device", "cpu"]) == 0
    preds = pd.read_csv(out, dtype={"key": str}).set_index("key")
    test = pd.read_parquet(evaluated_run / "predictions" / "test.parquet").set_index("row_key")
    assert len(preds) == len(pd.read_parquet(tiny_manifests / "dicom_style" / "manifest.parquet"))
    cols = [c for c in test.columns if c.startswith("prob__")]
    assert set(test.index) <= set(preds.index)
    np.testing.assert_allclose(preds.loc[test.index, cols].to_numpy(), test[cols].to_numpy(), atol=1e-5)


def test_site_model_and_its_thresholds(evaluated_run, few_scans, tmp_path):
    """``--site``: that site's own model (here a head shifted by +3 logits) scores the images."""
    from fedcxr.pipeline.checkpoints import load_final_model, save_final

    run = tmp_path / "run"
    shutil.copytree(evaluated_run, run)
    final = load_final_model(run)
    own = {k: v.clone() for k, v in final["global"].items()}
    own["head.bias"] += 3.0
    final["per_site"] = {"dicom_style": own}
    save_final(run, final)
    assert main(["predict", str(run), "--input", str(few_scans), "--out", str(tmp_path / "g.csv"), "-q"]) == 0
    assert main(["predict", str(run), "--input", str(few_scans), "--out", str(tmp_path / "s.csv"), "-q",
                 "--site", "dicom_style"]) == 0
    g, s = pd.read_csv(tmp_path / "g.csv"), pd.read_csv(tmp_path / "s.csv")
    cols = [c for c in g.columns if c.startswith("prob__")]
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    np.testing.assert_allclose(logit(s[cols].to_numpy()), logit(g[cols].to_numpy()) + 3.0, atol=1e-3)


def test_bad_uses_exit_2_naming_the_problem(evaluated_run, scan_folder, tmp_path, capsys):
    run = str(evaluated_run)
    assert main(["predict", run, "--input", str(scan_folder), "--out", str(scan_folder / "p.csv"), "-q"]) == 2
    assert "never writes into the input" in capsys.readouterr().err
    assert main(["predict", run, "--input", str(scan_folder), "--out", str(tmp_path / "p.csv"), "--site", "mars"]) == 2
    assert "not a site of this run" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no images")
    assert main(["predict", run, "--input", str(empty), "--out", str(tmp_path / "p.csv"), "-q"]) == 2
    assert "--input" in capsys.readouterr().err
    assert main(["predict", str(tmp_path), "--input", str(scan_folder), "--out", str(tmp_path / "p.csv")]) == 2
    assert "not a finished run" in capsys.readouterr().err


def test_unreadable_files_are_listed_not_dropped(evaluated_run, scan_folder, tmp_path):
    (scan_folder / "broken.dcm").write_bytes(b"DICM" * 10)
    out = tmp_path / "p.csv"
    assert main(["predict", str(evaluated_run), "--input", str(scan_folder), "--out", str(out), "-q"]) == 0
    assert len(pd.read_csv(out)) == 9
    key_map = pd.read_csv(tmp_path / "p.private-key-map.csv", keep_default_na=False)
    broken = key_map.loc[key_map["image_path"] == "broken.dcm"]
    assert len(broken) == 1 and broken["status"].iloc[0].startswith("not scored: ") and broken["key"].iloc[0] == ""


def test_predict_uses_cuda_when_asked(evaluated_run, scan_folder, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "p.csv"
    assert main(["predict", str(evaluated_run), "--input", str(scan_folder), "--out", str(out), "--device", "cuda",
                 "-q"]) == 0
    assert len(pd.read_csv(out)) == 9


def test_predict_cam_writes_overlays_of_the_top_images(evaluated_run, few_scans, tmp_path):
    out = tmp_path / "p.csv"
    assert main(["predict", str(evaluated_run), "--input", str(few_scans), "--out", str(out), "--cam", "2",
                 "-q"]) == 0
    preds = pd.read_csv(out, dtype={"key": str})
    classes = [c.removeprefix("prob__") for c in preds.columns if c.startswith("prob__")]
    cam = tmp_path / "p.cam"
    for cls in classes:
        top = set(preds.nlargest(2, f"prob__{cls}")["key"])
        assert {p.stem for p in (cam / cls).glob("*.png")} == top
    assert not any(p.stem in str(f) for f in cam.rglob("*") for p in few_scans.rglob("*.dcm"))


def test_keys_are_stable_under_a_site_key_and_fresh_without(evaluated_run, few_scans, tmp_path):
    import os
    import secrets

    key = tmp_path / "site.key"
    key.write_text(secrets.token_hex(32) + "\n")
    os.chmod(key, 0o600)
    keys = []
    for name, extra in (("a", ["--site-key", str(key)]), ("b", ["--site-key", str(key)]), ("c", [])):
        out = tmp_path / f"{name}.csv"
        assert main(["predict", str(evaluated_run), "--input", str(few_scans), "--out", str(out), "-q", *extra]) == 0
        keys.append(list(pd.read_csv(out, dtype={"key": str})["key"]))
    assert keys[0] == keys[1]
    assert not set(keys[0]) & set(keys[2])


def test_a_run_without_target_says_why_decisions_are_omitted(evaluated_run, tiny_manifests, tmp_path, capsys):
    """No `target:` and thresholds of two sites: no single choice, so probabilities only — said, not silent;
    ``--site`` picks one site's thresholds. A run never evaluated says so too."""
    run = tmp_path / "run"
    shutil.copytree(evaluated_run, run)
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "target": None}))
    points = json.loads((run / "operating_points.json").read_text())
    (run / "operating_points.json").write_text(json.dumps({**points, "nih_style": points["dicom_style"]}))
    site = str(tiny_manifests / "dicom_style")

    assert main(["predict", str(run), "--input", site, "--out", str(tmp_path / "a.csv"), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "no decisions, probabilities only" in printed and "has no `target:`" in printed
    assert "dicom_style, nih_style" in printed and "--site NAME" in printed
    assert not [c for c in pd.read_csv(tmp_path / "a.csv").columns if c.startswith("youden__")]

    assert main(["predict", str(run), "--input", site, "--out", str(tmp_path / "b.csv"), "--site", "dicom_style",
                 "--device", "cpu", "-q"]) == 0
    assert "decisions at the operating points chosen on dicom_style's" in capsys.readouterr().out
    assert [c for c in pd.read_csv(tmp_path / "b.csv").columns if c.startswith("youden__")]

    (run / "operating_points.json").unlink()
    assert main(["predict", str(run), "--input", site, "--out", str(tmp_path / "c.csv"), "--device", "cpu",
                 "-q"]) == 0
    assert "has a report but no operating_points.json" in capsys.readouterr().out  # evaluated, no thresholds kept
    (run / "report.json").unlink()
    assert main(["predict", str(run), "--input", site, "--out", str(tmp_path / "c.csv"), "--device", "cpu",
                 "-q"]) == 0
    assert "the run was never evaluated" in capsys.readouterr().out
