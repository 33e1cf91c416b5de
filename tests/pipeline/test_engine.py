"""The hardware engine: settings chosen for CUDA vs CPU, backend switches, offloading waiting sites."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import fedcxr.pipeline.site_runner as site_runner
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.engine import (
    MAX_AUTO_WORKERS,
    backend_settings,
    loader_options,
    resolve_engine,
    usable_cores,
)
from fedcxr.pipeline.inprocess import build_runners, run_engine
from fedcxr.pipeline.messages import TrainTask
from fedcxr.pipeline.state import cpu_state

from ..conftest import tiny_config
from .test_local import CLASSES, toy_dataset, toy_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_cpu_defaults_leave_every_gpu_feature_off():
    engine = resolve_engine("cpu")
    assert (engine.amp, engine.channels_last, engine.cudnn_benchmark, engine.pin_memory) == (False,) * 4
    assert (engine.num_workers, engine.persistent_workers, engine.prefetch_factor) == (0, False, None)
    assert engine.offload_idle is False and engine.deterministic is False
    assert engine.cache_workers == usable_cores()  # decoding the cache uses every core on any device
    assert loader_options(engine) == {"num_workers": 0, "pin_memory": False, "device": torch.device("cpu")}
    assert engine.threads == 1  # the thread policy: one intra-op thread per process


def test_cuda_defaults_turn_the_gpu_features_on():
    engine = resolve_engine(torch.device("cuda"))  # resolving needs no GPU
    assert (engine.amp, engine.channels_last, engine.cudnn_benchmark, engine.pin_memory) == (True,) * 4
    assert engine.offload_idle is True
    assert engine.num_workers == min(MAX_AUTO_WORKERS, usable_cores() - 1)
    if engine.num_workers:
        assert loader_options(engine) == {"num_workers": engine.num_workers, "pin_memory": True,
                                          "device": torch.device("cuda"), "persistent_workers": True,
                                          "prefetch_factor": 4}
        assert loader_options(engine, train=False)["persistent_workers"] is False  # a one-pass loader


def test_explicit_settings_win_and_deterministic_disables_autotuning():
    engine = resolve_engine("cuda", {"amp": False, "channels_last": False, "deterministic": True,
                                     "pin_memory": False, "offload_idle": False, "cache_workers": 3,
                                     "prefetch_factor": 2}, num_workers=5)
    assert (engine.amp, engine.channels_last, engine.cudnn_benchmark, engine.pin_memory) == (False,) * 4
    assert engine.deterministic and not engine.offload_idle
    assert (engine.num_workers, engine.prefetch_factor, engine.cache_workers) == (5, 2, 3)
    cpu = resolve_engine("cpu", {"amp": True, "pin_memory": True, "offload_idle": True, "cudnn_benchmark": True})
    assert not (cpu.amp or cpu.pin_memory or cpu.offload_idle or cpu.cudnn_benchmark)  # CUDA-only features


def test_backend_settings_are_set_for_the_run_and_restored():
    cudnn = torch.backends.cudnn
    before = (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled())
    with backend_settings(resolve_engine("cuda")):
        assert cudnn.benchmark is True
    assert (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled()) == before
    with backend_settings(resolve_engine("cuda", {"deterministic": True})):
        assert cudnn.benchmark is False and cudnn.deterministic is True
        assert torch.are_deterministic_algorithms_enabled()
    assert (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled()) == before
    with backend_settings(resolve_engine("cpu")):
        assert cudnn.benchmark == before[0]  # a CPU run leaves cuDNN alone


def test_engine_block_of_the_config(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", engine={"channels_last": True, "cache_workers": 2},
                       num_workers=1)
    cfg = load_config(data=data)
    engine = run_engine(cfg, torch.device("cpu"))
    assert engine.channels_last and engine.cache_workers == 2 and engine.num_workers == 1
    from fedcxr.pipeline.config import config_fingerprint

    plain = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache"))
    assert config_fingerprint(cfg) == config_fingerprint(plain)  # a run may resume with other engine settings
    with pytest.raises(Exception, match="engine.cache_worker"):
        load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", engine={"cache_worker": 2}))


def test_channels_last_training_matches_and_sends_contiguous_state():
    from fedcxr.pipeline.data import make_loader
    from fedcxr.pipeline.local import LocalConfig, train_local

    results = {}
    for layout in (False, True):
        model = toy_model()
        loader = make_loader(toy_dataset(), batch_size=8, shuffle=True, seed=1, augment=False)
        cfg = LocalConfig(lr=1e-3, batch_size=8, steps=3, channels_last=layout)
        train_local(model, loader, cfg, device="cpu", seed=0)
        conv = next(p for p in model.parameters() if p.ndim == 4 and p.shape[1] > 1 and p.shape[-1] > 1)
        assert conv.is_contiguous(memory_format=torch.channels_last) == layout
        results[layout] = cpu_state(model)
    for key, value in results[True].items():
        assert value.is_contiguous(), key
        # Adam moves each weight by at most ~lr a step, so two runs whose float sums differ in order
        # (NHWC kernels) stay within 2 × steps × lr of each other
        assert float((value.float() - results[False][key].float()).abs().max()) <= 2 * 3 * 1e-3 * 1.05 or \
            "running_var" in key or "num_batches" in key, key
    # the same weights give the same outputs in either layout
    model = toy_model().eval()
    x = torch.stack([toy_dataset()[i]["image"] for i in range(8)])
    plain = model(x)["main"]
    nhwc = model.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))["main"]
    torch.testing.assert_close(nhwc, plain, rtol=1e-4, atol=1e-5)


def test_a_waiting_site_is_offloaded_after_every_task(tiny_manifests, tmp_path, monkeypatch):
    """With ``offload_idle`` the runner moves its models off the device after each task, and
    the training result is the same bit for bit."""
    moved = []
    real = site_runner.offload
    monkeypatch.setattr(site_runner, "offload", lambda models, device: (moved.append(device), real(models, device)))
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache"))
    replies, params = {}, None
    for flag in (False, True):
        runners = build_runners(cfg, torch.device("cpu"), progress=False)
        runner = runners["nih_style"]
        runner.engine = dataclasses.replace(runner.engine, offload_idle=flag)
        params = params or cpu_state(runner.model(CLASSES, []))  # both runners start from the same weights
        config = TrainTask.build(round=0, seed=0, role="source", head_classes=CLASSES, param_classes=CLASSES, lr=1e-3,
                                 batch_size=8, steps=2)
        replies[flag] = runner.handle("train", params, config)
        assert all(p.device.type == "cpu" for m in runner._models.values() for p in m.parameters())
    assert moved == ["cpu"]  # only the runner with offload_idle moved its models
    for key, value in replies[True].params.items():
        assert torch.equal(value, replies[False].params[key]), key


def test_cache_workers_reach_the_cache_builder(tiny_manifests, tmp_path, monkeypatch):
    import fedcxr.pipeline.data as data

    seen = []
    real = data.cache_images
    monkeypatch.setattr(data, "cache_images", lambda *a, **k: (seen.append(k.get("workers")), real(*a, **k))[1])
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", engine={"cache_workers": 2}))
    runner = build_runners(cfg, torch.device("cpu"), progress=False)["nih_style"]
    images = runner.dataset("train", CLASSES, [], augment=False)
    assert seen == [2] and len(images) > 0
    assert np.asarray(images.images).dtype == np.uint8


def test_persistent_loader_is_kept_across_rounds_and_changes_nothing(tiny_manifests, tmp_path):
    """With persistent workers a site keeps its training loader (workers start once per run)
    and re-seeds it every round; the rounds' results equal those of fresh, worker-less loaders."""
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", augment=True))
    outcomes, params = {}, None
    for workers in (0, 2):
        runner = build_runners(cfg, torch.device("cpu"), progress=False)["nih_style"]
        runner.engine = dataclasses.replace(runner.engine, num_workers=workers, persistent_workers=workers > 0,
                                            prefetch_factor=2 if workers else None)
        params = params or cpu_state(runner.model(CLASSES, []))
        replies = []
        for round_ in (0, 1):
            config = TrainTask.build(round=round_, seed=0, role="source", head_classes=CLASSES,
                                     param_classes=CLASSES, lr=1e-3, batch_size=8, steps=3)
            replies.append(runner.handle("train", params, config).params)
        assert len(runner._loaders) == (1 if workers else 0)
        outcomes[workers] = replies
    for fresh, kept in zip(outcomes[0], outcomes[2]):
        for key in fresh:
            assert torch.equal(fresh[key], kept[key]), key
    assert not all(torch.equal(outcomes[0][0][k], outcomes[0][1][k]) for k in outcomes[0][0])  # rounds differ
