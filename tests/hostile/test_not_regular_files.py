"""Files that are not files, and the MONAI bundle's own integrity (SECURITY.md I15, B1-B3).

A named pipe in an input folder used to hang ``ingest images`` and ``predict`` forever; the bundle
runtime followed a symbolic link out of ``--dataset_dir``, aborted the whole run on one zero-byte
file, shipped TorchScript naming the exporting machine's paths and had no checksum. Every test that
could hang carries a timeout, so a regression fails instead of blocking the suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fedcxr.cli import main
from fedcxr.site_adapters.ingest import run_ingest

pytestmark = pytest.mark.timeout(120)


def _png(path: Path, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (16, 16), dtype=np.uint8), "L").save(path)
    return path


def hostile_folder(root: Path) -> Path:
    """Two real PNGs, a named pipe, a UNIX socket, a zero-byte file and a link out of the folder."""
    folder = root / "scans"
    _png(folder / "a.png", 1)
    _png(folder / "sub" / "b.png", 2)
    os.mkfifo(folder / "pipe.png")
    (folder / "empty.dcm").write_bytes(b"")
    _png(root / "elsewhere" / "secret.png", 3)
    (folder / "outside.png").symlink_to(root / "elsewhere" / "secret.png")
    return folder


@pytest.fixture
def listening_socket(tmp_path):
    """A UNIX socket file inside the folder, listening (opening it as a file fails with ENXIO)."""
    folder = tmp_path / "scans"
    folder.mkdir(exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = folder / "s.dcm"
    if len(str(path)) > 100:
        pytest.skip("temporary path too long for a UNIX socket")
    sock.bind(str(path))
    sock.listen(1)
    yield path
    sock.close()


@pytest.fixture(scope="module")
def model_run(tmp_path_factory) -> Path:
    """A run directory with an untrained resnet_tiny (seeded): enough to score files with."""
    from fedcxr.models.network import network_from_config
    from fedcxr.pipeline.checkpoints import save_final

    run = tmp_path_factory.mktemp("model_run") / "run"
    classes = ["edema", "pneumonia"]
    model_cfg = {"backbone": "resnet_tiny", "hidden": 8}
    torch.manual_seed(0)
    model = network_from_config(classes, model_cfg, {})
    save_final(run, {"global": model.state_dict(), "per_site": {}, "local_states": {}, "eval_local_keys": [],
                     "classes": classes, "aux_tasks": [], "model": model_cfg, "image_size": 16})
    (run / "run.json").write_text(json.dumps({"method": "FedAvg", "seed": 0, "target": None, "classes": classes,
                                              "sites": ["a"], "eval_sites": ["a"]}))
    return run


def test_ingest_sets_aside_pipes_sockets_and_empty_files_never_hanging(tmp_path, listening_socket):
    folder = hostile_folder(tmp_path)
    report = run_ingest("images", folder, tmp_path / "out", site_name="input", progress=False)
    reasons = {row["image_path"]: row["reason"] for row in report["set_aside"]}
    assert report["rows_kept"] == 2
    assert reasons["pipe.png"] == "not a regular file (a named pipe)"
    assert reasons["s.dcm"] == "not a regular file (a socket)"
    assert reasons["empty.dcm"] == "empty file (0 bytes)"
    assert reasons["outside.png"].startswith("image path outside the export folder")


def test_a_link_to_a_device_is_set_aside_even_with_follow_links(tmp_path):
    folder = tmp_path / "scans"
    _png(folder / "a.png")
    (folder / "zero.dcm").symlink_to("/dev/zero")
    report = run_ingest("images", folder, tmp_path / "out", site_name="input", progress=False, follow_links=True)
    reasons = {row["image_path"]: row["reason"] for row in report["set_aside"]}
    assert reasons == {"zero.dcm": "not a regular file (a character device)"}


def test_predict_scores_the_real_images_and_lists_the_rest(model_run, tmp_path, capsys):
    folder = hostile_folder(tmp_path)
    out = tmp_path / "p.csv"
    code = main(["predict", str(model_run), "--input", str(folder), "--out", str(out), "-q", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    assert len(pd.read_csv(out)) == 2
    key_map = pd.read_csv(tmp_path / "p.private-key-map.csv", keep_default_na=False).set_index("image_path")
    assert key_map.loc["pipe.png", "status"] == "not scored: not a regular file (a named pipe)"
    assert key_map.loc["empty.dcm", "status"] == "not scored: empty file (0 bytes)"


def test_predict_on_a_manifest_whose_image_became_a_pipe_sets_it_aside(model_run, tmp_path, capsys):
    folder = tmp_path / "scans"
    for i in range(3):
        _png(folder / f"{i}.png", i)
    run_ingest("images", folder, tmp_path / "manifests", site_name="input", progress=False)
    (folder / "1.png").unlink()
    os.mkfifo(folder / "1.png")  # the export changed after ingest: never opened
    code = main(["predict", str(model_run), "--input", str(tmp_path / "manifests" / "input"), "--out",
                 str(tmp_path / "p.csv"), "-q", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    key_map = pd.read_csv(tmp_path / "p.private-key-map.csv", keep_default_na=False).set_index("image_path")
    assert key_map.loc["1.png", "status"] == "not scored: not a regular file (a named pipe)"
    assert (key_map["status"] == "scored").sum() == 2


# --------------------------------------------------------------------------- the MONAI bundle


def test_the_bundle_runtime_lists_contains_and_sets_aside_per_file(tmp_path):
    from fedcxr.bundle.runtime import LoadFedcxrImaged, ProbabilityWriter, list_images

    folder = hostile_folder(tmp_path)
    items = {item["image_path"]: item for item in list_images(str(folder))}
    assert items["outside.png"]["unread"].startswith("image path outside dataset_dir")
    assert items["pipe.png"]["unread"] == "not a regular file (a named pipe)"
    assert items["a.png"]["unread"] == "" and items["empty.dcm"]["unread"] == ""
    load = LoadFedcxrImaged(keys="image", size=16)
    loaded = {name: load(item) for name, item in items.items()}
    assert loaded["empty.dcm"]["unread"] == "empty file (0 bytes)", "decoded per file: one bad file is set aside"
    assert loaded["a.png"]["unread"] == "" and loaded["a.png"]["image"].shape == (1, 16, 16)
    assert loaded["outside.png"]["image"].abs().sum() == 0, "a file leading out is never read"

    writer = ProbabilityWriter(str(tmp_path / "out"), ["edema"])

    class Engine:  # what ignite hands the handler: a decollated batch and its outputs
        class state:
            batch = list(loaded.values())
            output = [{"pred": torch.tensor([0.25])} for _ in loaded]

    writer.collect(Engine)
    writer.write(Engine)
    assert sorted(pd.read_csv(tmp_path / "out" / "predictions.csv")["image"]) == ["a.png", "sub/b.png"]
    unread = pd.read_csv(tmp_path / "out" / "unread.csv").set_index("image")["reason"]
    assert set(unread.index) == {"pipe.png", "empty.dcm", "outside.png"}


@pytest.fixture(scope="module")
def bundle(model_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "b"
    assert main(["export-bundle", str(model_run), "--out", str(out), "-q"]) == 0
    return out


def test_the_bundle_ships_checksums_that_sha256sum_and_the_runtime_check(bundle, tmp_path):
    import shutil

    from fedcxr.bundle.runtime import load_network, verify_bundle

    listed = [line.split("  ", 1)[1] for line in (bundle / "checksums.sha256").read_text().splitlines()]
    assert {"models/model.ts", "configs/inference.json", "configs/metadata.json", "scripts/fedcxr_runtime.py",
            "docs/README.md"} <= set(listed)
    assert subprocess.run(["sha256sum", "--quiet", "-c", "checksums.sha256"], cwd=bundle).returncode == 0
    verify_bundle(bundle)
    assert load_network(str(bundle))(torch.zeros(1, 1, 16, 16)).shape == (1, 2)
    for damage, message in ((lambda b: (b / "configs" / "inference.json").write_text("{}"),
                             "configs/inference.json: changed"),
                            (lambda b: (b / "scripts" / "evil.py").write_text("import os"),
                             "scripts/evil.py: not part of the exported bundle"),
                            (lambda b: (b / "models" / "model.ts").unlink(), "models/model.ts: missing")):
        copy = tmp_path / f"copy{len(message)}"
        shutil.copytree(bundle, copy)
        damage(copy)
        with pytest.raises(RuntimeError, match=message):
            load_network(str(copy))


def test_the_torchscript_holds_no_path_of_the_exporting_machine(bundle, model_run):
    needles = {str(Path(__file__).resolve().parents[2]), str(Path(torch.__file__).resolve().parents[1]),
               str(Path.home()), os.getcwd(), str(model_run), str(bundle)}
    with zipfile.ZipFile(bundle / "models" / "model.ts") as archive:
        assert not [n for n in archive.namelist() if n.endswith(".debug_pkl")]
        for name in archive.namelist():
            data = archive.read(name)
            assert not [n for n in needles if n.encode() in data], f"{name} names a path of this machine"
            assert b".tmp" not in name.encode(), "the archive is not named after a temporary file"
