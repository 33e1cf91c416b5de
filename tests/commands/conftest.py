"""Runs shared by the command tests: the quick demo, and a finished, evaluated tiny run."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from ..conftest import built_once, tiny_config


@pytest.fixture(scope="session")
def evaluated_run(tiny_manifests, tmp_path_factory) -> Path:
    """FedAvg_Finetune, one round, then ``fedcxr evaluate`` (operating points on val); built once per
    test run (:func:`tests.conftest.built_once`).

    The tiny run's validation split is too small to define every threshold, so known ones are
    written for two classes on top of what evaluate stored (youden 0.5, sens90 0.0), and the
    last class's are undefined (the ingest's random site key makes the splits vary by session).
    """
    from fedcxr.cli import main
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment

    def build(root: Path) -> None:
        run = root / "run"
        run_experiment(load_config(data=tiny_config(tiny_manifests, root / "cache", rounds=1)), run, progress=False)
        assert main(["evaluate", str(run), "--bootstrap", "0", "-q", "--device", "cpu"]) == 0
        points = json.loads((run / "operating_points.json").read_text())
        classes = json.loads((run / "run.json").read_text())["classes"]
        for cls in classes[:2]:
            points["dicom_style"][cls].update({"youden": 0.5, "sens90": 0.0, "reason": None})
        rules = [r for r in points["dicom_style"][classes[-1]] if r != "reason"]
        points["dicom_style"][classes[-1]] = {**dict.fromkeys(rules), "reason": "no positive rows in val split"}
        (run / "operating_points.json").write_text(json.dumps(points))

    return built_once(tmp_path_factory, "usemodel", build) / "run"


@pytest.fixture
def scan_folder(shared_data, tmp_path) -> Path:
    """A plain folder of new images: the real DICOMs of ../shared/data/dicom plus two real PNGs."""
    folder = tmp_path / "new_scans"
    shutil.copytree(shared_data / "dicom", folder / "dicom", ignore=shutil.ignore_patterns("*.md"))
    pngs = sorted((shared_data / "hannover-covid-19-image-repository").rglob("*.png"))[:2]
    for i, png in enumerate(pngs):
        shutil.copy(png, folder / f"portable_{i}.png")
    return folder


#: what the tests add to README's `fedcxr demo --out DIR` (the quick variant keeps CI fast)
DEMO_TEST_ARGS = ["--quick", "--device", "cpu"]


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory) -> tuple[Path, str, str]:
    """``fedcxr demo --out DIR --quick --device cpu`` once per session: (DIR, what it printed on stdout,
    on stderr — the console's log lines). Built once per test run, whatever the number of xdist
    workers (:func:`tests.conftest.built_once`).

    Tests that change a run copy DIR first."""
    from fedcxr.cli import main

    def build(root: Path) -> None:
        printed, logged = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(logged):
            assert main(["demo", "--out", str(root / "fedcxr-demo"), *DEMO_TEST_ARGS]) == 0
        (root / "stdout.txt").write_text(printed.getvalue(), encoding="utf-8")
        (root / "stderr.txt").write_text(logged.getvalue(), encoding="utf-8")

    root = built_once(tmp_path_factory, "demo", build)
    return (root / "fedcxr-demo", (root / "stdout.txt").read_text(encoding="utf-8"),
            (root / "stderr.txt").read_text(encoding="utf-8"))
