"""``fedcxr export-bundle``: a MONAI bundle that MONAI's own runner executes, same numbers as predict."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedcxr.cli import main

pytest.importorskip("fire", reason="MONAI's bundle runner needs `fire` (pip install fedcxr[bundle])")
pytest.importorskip("ignite", reason="MONAI's evaluator needs pytorch-ignite (pip install fedcxr[bundle])")

REPO = Path(__file__).resolve().parents[2]


def monai_run(bundle: Path, dataset_dir: Path, output_dir: Path) -> subprocess.CompletedProcess:
    """``python -m monai.bundle run`` exactly as the README gives it (fedcxr importable)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    return subprocess.run(
        [sys.executable, "-m", "monai.bundle", "run", "--bundle_root", str(bundle),
         "--config_file", str(bundle / "configs" / "inference.json"),
         "--dataset_dir", str(dataset_dir), "--output_dir", str(output_dir)],
        cwd=output_dir.parent, env=env, capture_output=True, text=True, timeout=600,
    )


@pytest.mark.slow  # MONAI's bundle runner in a subprocess (~5 s of imports)
def test_bundle_runs_with_monai_and_matches_predict(evaluated_run, scan_folder, tmp_path):
    bundle = tmp_path / "bundle"
    assert main(["export-bundle", str(evaluated_run), "--out", str(bundle), "-q"]) == 0
    for part in ("models/model.ts", "configs/metadata.json", "configs/inference.json", "configs/logging.conf",
                 "scripts/fedcxr_runtime.py", "docs/README.md"):
        assert (bundle / part).is_file(), part
    meta = json.loads((bundle / "configs" / "metadata.json").read_text())
    classes = json.loads((evaluated_run / "run.json").read_text())["classes"]
    assert meta["network_data_format"]["outputs"]["pred"]["channel_def"] == {str(i): c for i, c in enumerate(classes)}
    assert meta["fedcxr"]["operating_points"][classes[0]]["youden"] == 0.5
    assert meta["fedcxr"]["operating_points_site"] == "dicom_style"
    assert str(evaluated_run) not in (bundle / "configs" / "metadata.json").read_text()

    # files that are not images: one bad file never aborts the run, none is opened that should not be
    os.mkfifo(scan_folder / "pipe.dcm")
    (scan_folder / "empty.dcm").write_bytes(b"")
    (tmp_path / "secret.png").write_bytes((scan_folder / "portable_0.png").read_bytes())
    (scan_folder / "outside.png").symlink_to(tmp_path / "secret.png")
    hostile = {"pipe.dcm", "empty.dcm", "outside.png"}

    out = tmp_path / "monai_out"
    result = monai_run(bundle, scan_folder, out)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr  # MONAI's runner applied the bundle's configs/logging.conf
    assert "logging.conf does not exist" not in printed and " - INFO - " in result.stdout
    monai = pd.read_csv(out / "predictions.csv").set_index("image")
    unread = pd.read_csv(out / "unread.csv").set_index("image")["reason"]
    assert set(unread.index) == hostile and unread["pipe.dcm"] == "not a regular file (a named pipe)"

    assert main(["predict", str(evaluated_run), "--input", str(scan_folder), "--out", str(tmp_path / "p.csv"),
                 "-q", "--device", "cpu"]) == 0
    preds = pd.read_csv(tmp_path / "p.csv", dtype={"key": str}).set_index("key")
    key_map = pd.read_csv(tmp_path / "p.private-key-map.csv", dtype={"key": str}, keep_default_na=False)
    preds.index = key_map.set_index("key").loc[preds.index, "image_path"]
    # the bundle scores every file; predict scores a second copy of one SOPInstanceUID once (key map says so)
    assert len(monai) == 10 and set(preds.index) <= set(monai.index)
    not_scored = set(key_map.loc[key_map["status"] != "scored", "image_path"])
    assert hostile <= not_scored and set(monai.index) - set(preds.index) == not_scored - hostile
    cols = [f"prob__{c}" for c in classes]
    np.testing.assert_allclose(monai.loc[preds.index, cols].to_numpy(), preds[cols].to_numpy(), atol=1e-4)


def test_torchscript_model_is_the_network(evaluated_run, tmp_path):
    from fedcxr.pipeline.inference import load_run_model

    bundle = tmp_path / "b"
    assert main(["export-bundle", str(evaluated_run), "--out", str(bundle), "-q"]) == 0
    loaded = load_run_model(evaluated_run)
    x = torch.randn(4, 1, loaded.image_size, loaded.image_size)
    with torch.no_grad():
        expected = loaded.model(x)["main"]
        got = torch.jit.load(str(bundle / "models" / "model.ts"))(x)
    assert torch.allclose(got, expected, atol=1e-5)
    conf = configparser.RawConfigParser()  # MONAI bundle convention: configs/logging.conf, stdlib classes only
    conf.read(bundle / "configs" / "logging.conf")
    assert conf.get("logger_root", "handlers") == "consoleHandler"
    assert conf.get("handler_consoleHandler", "class") == "StreamHandler"
    assert conf.get("handler_consoleHandler", "args") == "(sys.stdout,)"


def test_export_refuses_a_used_folder_and_an_unknown_site(evaluated_run, tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("keep me")
    assert main(["export-bundle", str(evaluated_run), "--out", str(used)]) == 2
    assert "not empty" in capsys.readouterr().err and (used / "x").read_text() == "keep me"
    assert main(["export-bundle", str(evaluated_run), "--out", str(tmp_path / "b"), "--site", "mars"]) == 2
    assert "not a site of this run" in capsys.readouterr().err
