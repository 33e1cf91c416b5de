"""The CUDA path: demo, train, evaluate and resume on a GPU (skipped, not failed, without one).

These run in CI only where a GPU is present; on the 2-core CI they are reported as skipped.
Resume on CUDA is compared with a tolerance: cuDNN's convolution kernels are not bit-for-bit
deterministic unless ``torch.use_deterministic_algorithms(True)`` is set, which the test does
for the resumed pair (see the README's GPU notes).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml

from fedcxr.cli import main
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.federation import run_experiment

from ..conftest import tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _global(run_dir):
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)["global"]


def test_demo_runs_on_cuda(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--quick", "--device", "cuda"]) == 0
    report = json.loads((tmp_path / "demo" / "runs" / "FedAvg_Finetune" / "report.json").read_text())
    assert report["sites"]["dicom_style"]["mean_auroc"] > 0.5


def test_train_and_evaluate_on_cuda_with_amp(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", device="cuda", strategy="FedAvg_Finetune_AuxInfo_GP")
    run = run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    assert run["status"] == "finished"
    assert main(["evaluate", str(tmp_path / "run"), "--device", "cuda", "--bootstrap", "20", "-q"]) == 0
    assert all(torch.isfinite(v.float()).all() for v in _global(tmp_path / "run").values())


def test_resume_on_cuda_ends_with_the_same_model(tiny_manifests, tmp_path, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        data = tiny_config(tiny_manifests, tmp_path / "cache", device="cuda", rounds=3)
        config = tmp_path / "exp.yaml"
        config.write_text(yaml.safe_dump(data))
        assert main(["train", str(config), "--out", str(tmp_path / "straight"), "-q"]) == 0
        assert main(["train", str(config), "--out", str(tmp_path / "cut"), "--set", "rounds=3", "-q"]) == 0
        for path in sorted((tmp_path / "cut" / "checkpoints").glob("round_0002.pt*")):
            path.unlink()
        (tmp_path / "cut" / "final_model.pt").unlink()
        assert main(["train", str(config), "--out", str(tmp_path / "cut"), "--resume", "-q"]) == 0
        a, b = _global(tmp_path / "straight"), _global(tmp_path / "cut")
        worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())
        assert worst <= 1e-5, worst
    finally:
        torch.use_deterministic_algorithms(False)
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
