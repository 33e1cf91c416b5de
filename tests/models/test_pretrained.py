"""Pretrained weights in the layouts users have (README "Pretrained weights"): torchvision's and
TorchXRayVision's DenseNet-121, torchvision's ResNet-18. The state dicts are built here key by key
from each library's architecture (names and shapes as their files hold them, not derived from
fedcxr's own model); nothing is downloaded. What does not fit is reported, not silent."""

from __future__ import annotations

import logging

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.models.network import CXRNet

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bn(sd: dict, prefix: str, channels: int, *, counter: bool = True) -> None:
    sd[f"{prefix}.weight"] = torch.rand(channels) + 0.5
    sd[f"{prefix}.bias"] = torch.randn(channels) * 0.1
    sd[f"{prefix}.running_mean"] = torch.randn(channels) * 0.1
    sd[f"{prefix}.running_var"] = torch.rand(channels) + 0.5
    if counter:  # torchvision ≥ 0.4 saves it; the original ImageNet files predate it
        sd[f"{prefix}.num_batches_tracked"] = torch.tensor(100)


def densenet121_state_dict(in_channels: int, n_classes: int, *, legacy: bool = False) -> dict:
    """torchvision ``densenet121().state_dict()`` (growth 32, bn_size 4, blocks 6-12-24-16); ``legacy``:
    the released ImageNet file's ``norm.1``/``conv.1`` spelling and no ``num_batches_tracked``."""
    torch.manual_seed(0)
    sd: dict = {"features.conv0.weight": torch.randn(64, in_channels, 7, 7) * 0.05}
    _bn(sd, "features.norm0", 64, counter=not legacy)
    channels, sep = 64, "." if legacy else ""
    for block, layers in enumerate((6, 12, 24, 16), start=1):
        for layer in range(1, layers + 1):
            p = f"features.denseblock{block}.denselayer{layer}"
            _bn(sd, f"{p}.norm{sep}1", channels, counter=not legacy)
            sd[f"{p}.conv{sep}1.weight"] = torch.randn(128, channels, 1, 1) * 0.05
            _bn(sd, f"{p}.norm{sep}2", 128, counter=not legacy)
            sd[f"{p}.conv{sep}2.weight"] = torch.randn(32, 128, 3, 3) * 0.05
            channels += 32
        if block < 4:
            _bn(sd, f"features.transition{block}.norm", channels, counter=not legacy)
            sd[f"features.transition{block}.conv.weight"] = torch.randn(channels // 2, channels, 1, 1) * 0.05
            channels //= 2
    _bn(sd, "features.norm5", channels, counter=not legacy)
    sd["classifier.weight"], sd["classifier.bias"] = torch.randn(n_classes, channels), torch.randn(n_classes)
    return sd


def resnet18_state_dict() -> dict:
    """torchvision ``resnet18().state_dict()``: bias-free convs, shortcut ``downsample.0/1``, ``fc`` 1000."""
    torch.manual_seed(1)
    sd: dict = {"conv1.weight": torch.randn(64, 3, 7, 7) * 0.05}
    _bn(sd, "bn1", 64)
    inplanes = 64
    for stage, planes in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            p = f"layer{stage}.{block}"
            sd[f"{p}.conv1.weight"] = torch.randn(planes, inplanes if block == 0 else planes, 3, 3) * 0.05
            _bn(sd, f"{p}.bn1", planes)
            sd[f"{p}.conv2.weight"] = torch.randn(planes, planes, 3, 3) * 0.05
            _bn(sd, f"{p}.bn2", planes)
            if block == 0 and stage > 1:
                sd[f"{p}.downsample.0.weight"] = torch.randn(planes, inplanes, 1, 1) * 0.05
                _bn(sd, f"{p}.downsample.1", planes)
        inplanes = planes
    sd["fc.weight"], sd["fc.bias"] = torch.randn(1000, 512), torch.randn(1000)
    return sd


def _backbone_keys(model: CXRNet) -> set[str]:
    return {k for k in model.state_dict() if k.startswith("backbone.")}


@pytest.mark.parametrize("legacy", [False, True], ids=["torchvision", "torchvision-imagenet-file"])
def test_torchvision_densenet121_rgb_loads_every_backbone_entry(tmp_path, caplog, legacy):
    sd = densenet121_state_dict(3, 1000, legacy=legacy)
    torch.save(sd, tmp_path / "densenet121.pth")
    with caplog.at_level(logging.INFO, logger="fedcxr.models.network"):
        model = CXRNet(["edema", "pleural_effusion"], backbone="densenet121", hidden=128,
                       weights=tmp_path / "densenet121.pth")
    report = model.load_report
    counters = {k for k in _backbone_keys(model) if k.endswith("num_batches_tracked")}
    assert set(report["missing"]) - counters == {"proj.0.weight", "proj.0.bias", "head.weight", "head.bias"}
    assert report["shape_mismatch"] == [] and report["unexpected"] == []
    assert report["dropped"] == ["classifier.bias", "classifier.weight"]  # the ImageNet classifier, named
    state = model.state_dict()
    conv0 = state["backbone.features.conv0.weight"]
    assert conv0.shape == (64, 1, 7, 7) and torch.allclose(conv0, sd["features.conv0.weight"].sum(1, keepdim=True))
    sep = "." if legacy else ""
    assert torch.equal(state["backbone.features.denseblock3.denselayer24.layers.conv2.weight"],
                       sd[f"features.denseblock3.denselayer24.conv{sep}2.weight"])
    assert torch.equal(state["backbone.features.transition2.norm.running_var"],
                       sd["features.transition2.norm.running_var"])
    assert "stay randomly initialised" not in caplog.text  # every backbone entry came from the file
    assert "dropped: ['classifier.bias', 'classifier.weight']" in caplog.text


def test_torchxrayvision_densenet121_loads_and_its_thresholds_are_reported(tmp_path, caplog):
    """``xrv.models.DenseNet(weights=...)``'s state dict: 1-channel conv0, 18 outputs, ``op_threshs``."""
    sd = densenet121_state_dict(1, 18)
    sd["op_threshs"] = torch.rand(18)
    torch.save(sd, tmp_path / "xrv.pt")
    with caplog.at_level(logging.INFO, logger="fedcxr.models.network"):
        model = CXRNet(["cardiomegaly"], backbone="densenet121", hidden=None, weights=tmp_path / "xrv.pt")
    report = model.load_report
    assert report["unexpected"] == ["backbone.op_threshs"] and report["shape_mismatch"] == []
    assert report["dropped"] == ["classifier.bias", "classifier.weight"]
    assert torch.equal(model.state_dict()["backbone.features.conv0.weight"], sd["features.conv0.weight"])
    assert "unexpected: ['backbone.op_threshs']" in caplog.text and "stay randomly initialised" not in caplog.text
    x = torch.rand(2, 1, 64, 64)
    model.eval()
    assert torch.isfinite(model(x)["main"]).all()


def test_torchvision_resnet18_loads_with_zero_shortcut_biases(tmp_path, caplog):
    """MONAI's shortcut convs have a bias, torchvision's do not: it is set to 0, not left random."""
    sd = resnet18_state_dict()
    torch.save({"state_dict": sd}, tmp_path / "resnet18.pth")
    with caplog.at_level(logging.INFO, logger="fedcxr.models.network"):
        model = CXRNet(["edema"], backbone="resnet18", hidden=None, weights=tmp_path / "resnet18.pth")
    report = model.load_report
    assert report["shape_mismatch"] == [] and report["unexpected"] == [] and report["dropped"] == ["fc.bias", "fc.weight"]
    assert report["zero_bias"] == [f"backbone.layer{s}.0.downsample.0.bias" for s in (2, 3, 4)]
    assert set(report["missing"]) == {"head.weight", "head.bias"}
    state = model.state_dict()
    assert not state["backbone.layer3.0.downsample.0.bias"].any()
    assert torch.equal(state["backbone.layer4.1.bn2.running_mean"], sd["layer4.1.bn2.running_mean"])
    assert "stay randomly initialised" not in caplog.text


def test_a_file_of_another_architecture_is_a_warning_or_an_error_naming_it(tmp_path, caplog):
    """A ResNet-18 file into ResNet-10 loads what fits and WARNS about the rest; TorchXRayVision's ResNet
    (a ResNet-50 under ``model.``) matches nothing and is refused, saying what fedcxr loads."""
    torch.save(resnet18_state_dict(), tmp_path / "r18.pt")
    with caplog.at_level(logging.WARNING, logger="fedcxr.models.network"):
        model = CXRNet(["edema"], backbone="resnet10", hidden=None, weights=tmp_path / "r18.pt")
    assert model.load_report["unexpected"]  # layerN.1.* have no place in a ResNet-10: listed
    assert not [r for r in caplog.records if "stay randomly initialised" in r.getMessage()]
    small = CXRNet(["edema"], backbone="resnet18", hidden=None, stem="small", weights=tmp_path / "r18.pt")
    assert small.load_report["shape_mismatch"] == ["backbone.conv1.weight (64, 3, 7, 7)→(64, 1, 3, 3)"]
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING][-1]
    assert "1 of " in warning and "conv1.weight" in warning and "stay randomly initialised" in warning

    xrv_resnet = {f"model.{k}": v for k, v in resnet18_state_dict().items()}
    torch.save(xrv_resnet, tmp_path / "xrv_resnet.pt")
    with pytest.raises(UserError, match="matches no entry.*torchvision, TorchXRayVision or MONAI layout"):
        CXRNet(["edema"], backbone="resnet18", weights=tmp_path / "xrv_resnet.pt")
