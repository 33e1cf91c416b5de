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
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.messages import TrainTask

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
        # engine.deterministic: no cuDNN autotuning (its kernel choice may differ between runs)
        data = tiny_config(tiny_manifests, tmp_path / "cache", device="cuda", rounds=3, engine={"deterministic": True})
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


# --------------------------------------------------------------------------- the engine's GPU features


def test_engine_defaults_on_cuda_train_channels_last_with_amp_and_pinned_batches(tiny_manifests, tmp_path):
    from fedcxr.pipeline.engine import resolve_engine
    from fedcxr.pipeline.inprocess import build_runners
    from fedcxr.pipeline.state import cpu_state

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", device="cuda"))
    device = torch.device("cuda")
    engine = resolve_engine(device)
    assert engine.amp and engine.channels_last and engine.pin_memory and engine.offload_idle
    runner = build_runners(cfg, device, progress=False)["nih_style"]
    assert runner.engine.channels_last and runner.engine.amp
    classes = runner.class_set[:2]
    data = runner.dataset("train", classes, [], augment=False)
    from fedcxr.pipeline.data import make_loader

    batch = next(iter(make_loader(data, batch_size=8, shuffle=False, seed=0, augment=False,
                                  **runner.loader_options())))
    # uint8 pixels were pinned and copied asynchronously; the image is finished on the GPU
    assert batch["image"].device.type == "cuda" and batch["image"].dtype == torch.float32
    assert batch["label"].is_pinned()  # the rest stays page-locked on the host for an asynchronous copy
    params = cpu_state(runner.model(classes, []))
    config = TrainTask.build(round=0, seed=0, role="source", head_classes=classes, param_classes=classes, lr=1e-3,
                             batch_size=8, steps=3)
    reply = runner.handle("train", params, config)
    assert all(torch.isfinite(v.float()).all() and v.is_contiguous() for v in reply.params.values())
    model = runner.model(classes, [])
    conv = next(p for p in model.parameters() if p.ndim == 4 and p.shape[1] > 1 and p.shape[-1] > 1)
    assert conv.is_contiguous(memory_format=torch.channels_last)  # trained NHWC
    assert conv.device.type == "cpu"  # and then moved off the GPU: the site waits for its next turn


def test_waiting_sites_hold_no_gpu_memory_after_a_run(tiny_manifests, tmp_path):
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", device="cuda", rounds=1))
    runners = build_runners(cfg, torch.device("cuda"), progress=False)
    run_experiment(cfg, tmp_path / "run", progress=False, transport=InProcessTransport(runners))
    for name, runner in runners.items():
        for model in runner._models.values():
            assert all(t.device.type == "cpu" for t in model.state_dict().values()), name


def test_run_on_cuda_autotunes_cudnn_and_restores_it(tiny_manifests, tmp_path, monkeypatch):
    import fedcxr.pipeline.local as local

    seen = []
    real = local.train_local
    monkeypatch.setattr(local, "train_local",
                        lambda *a, **k: (seen.append(torch.backends.cudnn.benchmark), real(*a, **k))[1])
    before = torch.backends.cudnn.benchmark
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", device="cuda", rounds=1))
    run_experiment(cfg, tmp_path / "fast", progress=False)
    assert seen and all(seen)
    assert torch.backends.cudnn.benchmark == before
    seen.clear()
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", device="cuda", rounds=1,
                                       engine={"deterministic": True}))
    run_experiment(cfg, tmp_path / "exact", progress=False)
    assert seen and not any(seen)


def test_cached_loader_feeds_the_gpu_faster_than_it_trains(tmp_path):
    """The decode-once cache with the engine's loader settings delivers batches well faster than
    a resnet18 step at 224 px consumes them (the GPU never waits on data). Without augmentation:
    MONAI's per-item CPU augmentation is a separate cost (see BENCHMARKS.md)."""
    import time

    import numpy as np
    import pandas as pd

    from fedcxr.models.network import CXRNet
    from fedcxr.pipeline.data import SiteDataset, make_loader
    from fedcxr.pipeline.engine import loader_options, resolve_engine
    from fedcxr.pipeline.local import LocalConfig, train_local
    from fedcxr.vocab import label_column

    n, size = 512, 224
    images = np.random.default_rng(0).integers(0, 255, (n, size, size), dtype=np.uint8)
    frame = pd.DataFrame({label_column("edema"): np.arange(n) % 2 * 1.0})
    data = SiteDataset(images, frame, np.arange(n), classes=["edema"], aux_tasks=[], loss_classes=["edema"])
    engine = resolve_engine("cuda")
    loader = make_loader(data, batch_size=64, shuffle=True, seed=0, augment=False, **loader_options(engine))
    for _ in loader:  # start the workers
        break
    t0 = time.perf_counter()
    for _ in loader:
        pass
    feed = n / (time.perf_counter() - t0)
    model = CXRNet(["edema"], backbone="resnet18", hidden=128)
    cfg = LocalConfig(batch_size=64, epochs=1, amp=engine.amp, channels_last=engine.channels_last)
    train_local(model, loader, cfg, device="cuda", seed=0)  # warm-up (cuDNN autotuning)
    torch.cuda.synchronize()
    result = train_local(model, loader, cfg, device="cuda", seed=0)
    train = n / result.seconds
    assert feed > 1.5 * train, (feed, train)  # training includes loading: a starved GPU gives feed ≈ train


def test_batch_augmentation_on_the_gpu_matches_the_cpu():
    """One code path: the same draws and operations on CUDA tensors (float rounding apart)."""
    from fedcxr.pipeline.augment import AugmentConfig, augment_batch

    images = torch.rand(16, 1, 64, 64)
    seeds = list(range(16))
    cfg = AugmentConfig(prob=0.7, hflip=True)
    cpu = augment_batch(images, seeds, cfg)
    gpu = augment_batch(images.cuda(), seeds, cfg)
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=1e-4)
