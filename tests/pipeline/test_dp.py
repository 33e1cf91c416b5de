"""privacy.dp: DP-SGD local training with Opacus, per-site ε over rounds, resume (fedcxr.pipeline.dp)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment

from ..conftest import tiny_config

DP = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-5}
GROUP = {"backbone": "resnet_tiny", "hidden": 16, "norm": "group"}


def test_dp_with_a_batchnorm_model_is_a_config_error_naming_the_fix(tiny_manifests, tmp_path):
    with pytest.raises(UserError, match="privacy.dp.*BatchNorm.*model.norm: group"):
        load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", privacy={"dp": DP}))


def test_group_norm_backbone_has_no_batchnorm():
    from torch.nn.modules.batchnorm import _BatchNorm

    from fedcxr.models.network import CXRNet

    model = CXRNet(["cardiomegaly"], backbone="resnet_tiny", hidden=16, norm="group")
    assert not any(isinstance(m, _BatchNorm) for m in model.modules())
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())


def test_a_dp_step_moves_the_model_by_at_most_the_clipping_norm():
    pytest.importorskip("opacus")
    from fedcxr.models.network import CXRNet
    from fedcxr.pipeline.local import LocalConfig, train_local

    torch.manual_seed(0)
    data = [{"image": torch.randn(8, 1, 32, 32), "label": torch.randint(0, 2, (8, 1)).float(),
             "label_mask": torch.ones(8, 1)}]

    def moved(dp):
        model = CXRNet(["cardiomegaly"], backbone="resnet_tiny", hidden=16, norm="group")
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        cfg = LocalConfig(lr=1.0, batch_size=8, steps=1, use_aux=False, optimizer="sgd", dp=dp)
        train_local(model, data, cfg, device="cpu", seed=0)
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        assert not any(hasattr(p, "grad_sample") for p in model.parameters())  # Opacus' hooks are gone
        return float((after - before).norm())

    clip = 1e-3
    # SGD, lr 1: the step is the mean of per-sample gradients each clipped to `clip` (+ almost no noise)
    assert moved({"noise_multiplier": 1e-6, "max_grad_norm": clip}) <= clip * 1.01
    assert moved(None) > 100 * clip


@pytest.fixture(scope="module")
def dp_runs(tiny_manifests, tmp_path_factory):
    pytest.importorskip("opacus")
    root = tmp_path_factory.mktemp("dp")
    data = tiny_config(tiny_manifests, root / "cache", strategy="FedGP", rounds=2, eval_every=0, model=GROUP,
                       privacy={"dp": DP}, warmup_rounds=0)
    cfg = load_config(data=data)
    run = run_experiment(cfg, root / "straight", progress=False)
    return cfg, run, root


def test_each_site_reports_its_epsilon_in_run_json(dp_runs):
    _, run, root = dp_runs
    report = json.loads((root / "straight" / "run.json").read_text())["dp"]
    assert set(report) == {"nih_style", "chexpert_style", "dicom_style"}
    for site in report.values():
        assert site["epsilon"] > 0 and site["delta"] == DP["delta"] and site["calls"] == 2 and site["steps"] == 4
    rows = [json.loads(line) for line in (root / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["train"]["nih_style"]["dp"]["steps"] == 2


def test_epsilon_grows_with_rounds():
    pytest.importorskip("opacus")
    from fedcxr.pipeline.dp import epsilon

    one = epsilon([[1.0, 0.25, 2]], 1e-5)
    assert 0 < one < epsilon([[1.0, 0.25, 2], [1.0, 0.25, 2]], 1e-5) < epsilon([[0.5, 0.25, 4]], 1e-5)


def test_a_resumed_dp_run_keeps_the_epsilon_and_the_weights(dp_runs):
    cfg, run, root = dp_runs
    resumed = root / "resumed"
    shutil.copytree(root / "straight", resumed)
    (resumed / "final_model.pt").unlink()
    for path in (resumed / "checkpoints").glob("round_0001.pt*"):
        path.unlink()  # as if killed after round 0's checkpoint
    again = run_experiment(cfg, resumed, resume=True, progress=False)
    assert again["dp"] == run["dp"]
    a = torch.load(root / "straight" / "final_model.pt", weights_only=True)["global"]
    b = torch.load(resumed / "final_model.pt", weights_only=True)["global"]
    assert all(torch.equal(a[k], b[k]) for k in a)
