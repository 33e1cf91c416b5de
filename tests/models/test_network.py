"""CXRNet: outputs, state-dict layout that aggregation relies on, head rows by class, weights."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from fedcxr.errors import UserError
from fedcxr.models.network import CXRNet, bn_keys, head_keys

CLASSES3 = ["atelectasis", "edema", "pleural_effusion"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(classes=CLASSES3, **kw) -> CXRNet:
    kw.setdefault("backbone", "resnet_tiny")
    return CXRNet(classes, **kw)


@pytest.mark.parametrize("backbone", ["resnet_tiny", "resnet18"])
def test_forward_shapes_and_key_prefixes(backbone):
    torch.manual_seed(0)
    model = CXRNet(CLASSES3, backbone=backbone, hidden=16, aux_tasks={"sex": 2, "age_bin": 5})
    model.eval()
    out = model(torch.randn(2, 1, 32, 32))
    assert out["main"].shape == (2, 3)
    assert {k: v.shape for k, v in out["aux"].items()} == {"sex": (2, 2), "age_bin": (2, 5)}
    assert model.features(torch.randn(2, 1, 32, 32)).shape == (2, 16)
    prefixes = {k.split(".")[0] for k in model.state_dict()}
    assert prefixes == {"backbone", "proj", "head", "aux_heads"}
    assert head_keys(model) == ["head.weight", "head.bias"]
    aux = {k for k in model.state_dict() if k.startswith("aux_heads.")}
    assert aux == {f"aux_heads.{t}.{p}" for t in ("sex", "age_bin") for p in ("weight", "bias")}
    # the backbone's own classifier is gone: no 'fc.' / 'class_layers.out.' parameters left
    assert not any(".fc." in k or "class_layers.out" in k for k in model.state_dict())


def test_no_projection_and_no_aux_heads():
    model = tiny(hidden=None)
    assert not any(k.startswith(("proj.", "aux_heads.")) for k in model.state_dict())
    assert model.head.in_features == 64
    assert model(torch.randn(2, 1, 32, 32))["aux"] == {}


def test_random_init_follows_torch_seed():
    torch.manual_seed(3)
    a = tiny()
    torch.manual_seed(3)
    b = tiny()
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_classes_must_be_canonical_and_unique():
    with pytest.raises(UserError, match="Effusion"):
        tiny(["Effusion"])
    with pytest.raises(UserError, match="duplicate"):
        tiny(["edema", "edema"])
    with pytest.raises(UserError, match="backbone"):
        tiny(backbone="vgg16")


def test_bn_keys_detected_by_module_type_whatever_the_name():
    model = tiny()
    keys = bn_keys(model)
    assert "backbone.bn1.running_mean" in keys and "backbone.bn1.num_batches_tracked" in keys
    assert "backbone.conv1.weight" not in keys and "head.weight" not in keys
    # a BN layer with an uninformative name is still found from its type
    model.proj = nn.Sequential(nn.Linear(64, 8), nn.BatchNorm1d(8))
    assert {"proj.1.weight", "proj.1.bias", "proj.1.running_var"} <= set(bn_keys(model))
    assert "proj.0.weight" not in bn_keys(model)


def test_own_checkpoint_round_trip(tmp_path):
    torch.manual_seed(1)
    a = tiny(aux_tasks={"sex": 2})
    torch.save({"state_dict": a.state_dict(), "epoch": 3}, tmp_path / "ckpt.pt")
    torch.manual_seed(2)
    b = tiny(aux_tasks={"sex": 2}, weights=tmp_path / "ckpt.pt")
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert b.load_report["missing"] == [] and b.load_report["shape_mismatch"] == []


def test_rgb_backbone_checkpoint_loads_into_gray_model(tmp_path, caplog):
    """A 3-channel backbone (torchvision-style keys, with its own classifier) → 1 channel."""
    torch.manual_seed(4)
    rgb = CXRNet(CLASSES3, backbone="resnet_tiny", in_channels=3).backbone
    state = {f"module.{k}": v for k, v in rgb.state_dict().items()}  # DataParallel prefix
    state["module.fc.weight"] = torch.randn(1000, 64)
    state["module.fc.bias"] = torch.randn(1000)
    torch.save(state, tmp_path / "rgb.pth")
    with caplog.at_level(logging.INFO, logger="fedcxr.models.network"):
        gray = tiny(["edema"], weights=tmp_path / "rgb.pth")
    conv = gray.backbone.conv1.weight
    assert conv.shape[1] == 1
    assert torch.allclose(conv, rgb.conv1.weight.sum(1, keepdim=True))
    assert torch.equal(gray.backbone.layer1[0].bn1.running_var, rgb.layer1[0].bn1.running_var)
    report = gray.load_report
    assert set(report["missing"]) == {k for k in gray.state_dict() if not k.startswith("backbone.")}
    assert "loaded" in caplog.text and "missing" in caplog.text
    x = torch.rand(1, 1, 32, 32)
    gray.eval(), rgb.eval()
    assert torch.allclose(gray.backbone(x), rgb(x.expand(1, 3, 32, 32)), atol=1e-5)  # gray = R=G=B


def test_torchvision_densenet_names_are_mapped(tmp_path):
    torch.manual_seed(5)
    ref = CXRNet(["edema"], backbone="densenet121", hidden=None)
    state = {}
    for key, value in ref.backbone.state_dict().items():
        # torchvision's layout: denselayerN.norm1 instead of MONAI's denselayerN.layers.norm1
        state[key.replace(".layers.", ".")] = value
    state["classifier.weight"], state["classifier.bias"] = torch.randn(14, 1024), torch.randn(14)
    torch.save(state, tmp_path / "dn.pth")
    model = CXRNet(["edema"], backbone="densenet121", hidden=None, weights=tmp_path / "dn.pth")
    assert set(model.load_report["missing"]) == {"head.weight", "head.bias"}
    assert torch.equal(model.backbone.features.denseblock4.denselayer16.layers.conv2.weight,
                       ref.backbone.features.denseblock4.denselayer16.layers.conv2.weight)


def test_bad_weight_files_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        tiny(weights=tmp_path / "none.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(UserError, match="junk.pt"):
        tiny(weights=tmp_path / "junk.pt")
    torch.save({"encoder.weight": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="matches no entry"):
        tiny(weights=tmp_path / "other.pt")


def test_densenet121_without_download(monkeypatch):
    """MONAI's pretrained path would download (and fail offline): we never take it."""

    def refuse(*args, **kwargs):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    model = CXRNet(CLASSES3, backbone="densenet121", aux_tasks={"view": 3})
    model.eval()
    out = model(torch.randn(2, 1, 32, 32))
    assert out["main"].shape == (2, 3) and out["aux"]["view"].shape == (2, 3)
    assert model.proj[0].in_features == 1024
    assert {k.split(".")[0] for k in model.state_dict()} == {"backbone", "proj", "head", "aux_heads"}
    assert not any("class_layers.out" in k for k in model.state_dict())


# --------------------------------------------------------------------------- warm start from a fedcxr run


def _final_payload(model: CXRNet) -> dict:
    """What ``fedcxr train`` writes as ``final_model.pt`` (the parts warm start reads)."""
    return {"global": model.state_dict(), "per_site": {}, "classes": list(model.classes),
            "aux_tasks": list(model.aux_tasks), "model": {"backbone": "resnet_tiny"}, "image_size": 32}


def test_warm_start_from_final_model_matches_head_rows_by_class(tmp_path):
    torch.manual_seed(1)
    trained = tiny(["atelectasis", "edema", "pleural_effusion"], aux_tasks={"sex": 2})
    torch.save(_final_payload(trained), tmp_path / "final_model.pt")
    torch.manual_seed(2)
    fresh = tiny(["pneumonia", "edema", "atelectasis"], aux_tasks={"sex": 2})
    init_pneumonia = fresh.head.weight[0].detach().clone()
    torch.manual_seed(2)
    warm = tiny(["pneumonia", "edema", "atelectasis"], aux_tasks={"sex": 2}, weights=tmp_path / "final_model.pt")
    own, ref = warm.state_dict(), trained.state_dict()
    assert all(torch.equal(own[k], ref[k]) for k in ref if not k.startswith("head."))
    assert torch.equal(warm.head.weight[1], trained.head.weight[1])  # edema: row 1 in both
    assert torch.equal(warm.head.weight[2], trained.head.weight[0])  # atelectasis: row 0 in the file
    assert torch.equal(warm.head.bias[2], trained.head.bias[0])
    assert torch.equal(warm.head.weight[0], init_pneumonia)  # not in the file: its fresh init
    assert warm.load_report["new_head_classes"] == ["pneumonia"]
    assert warm.load_report["shape_mismatch"] == []


def test_warm_start_from_checkpoint_takes_its_global_weights(tmp_path):
    torch.manual_seed(3)
    trained = tiny(["edema", "atelectasis"])
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    # a checkpoint of an older run: no classes inside, run.json beside it names them
    (run / "run.json").write_text('{"classes": ["edema", "atelectasis"]}')
    torch.save({"round": 4, "fingerprint": "x", "state": {"global": trained.state_dict(), "best": {}}},
               run / "checkpoints" / "round_0004.pt")
    warm = tiny(["atelectasis", "edema"], weights=run / "checkpoints" / "round_0004.pt")
    assert torch.equal(warm.head.weight[0], trained.head.weight[1])
    assert torch.equal(warm.backbone.conv1.weight, trained.backbone.conv1.weight)
    assert warm.load_report["file_classes"] == ["edema", "atelectasis"]


def test_weights_file_with_code_is_refused_not_run(tmp_path):
    import pickle

    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    with open(tmp_path / "evil.pt", "wb") as fp:
        pickle.dump({"global": Payload()}, fp)
    with pytest.raises(UserError, match=r"model\.weights: .*evil\.pt.*refused"):
        tiny(weights=tmp_path / "evil.pt")
    torch.save({"global": {"backbone.conv1.weight": "text"}, "classes": ["edema"]}, tmp_path / "odd.pt")
    with pytest.raises(UserError, match="not all tensors"):
        tiny(weights=tmp_path / "odd.pt")


def _layer1_size(model: CXRNet, size: int) -> int:
    seen = []
    handle = model.backbone.layer1.register_forward_hook(lambda m, i, o: seen.append(o.shape[-1]))
    model.eval()
    with torch.no_grad():
        model(torch.randn(1, 1, size, size))
    handle.remove()
    return seen[0]


def test_small_stem_keeps_the_resolution_of_small_images():
    """MedMNIST-size images: the `small` stem (3x3 stride 1, no max-pool) keeps 28 px where ImageNet's leaves 7."""
    assert _layer1_size(tiny(), 28) == 7
    small = tiny(stem="small")
    assert _layer1_size(small, 28) == 28
    assert small.backbone.conv1.kernel_size == (3, 3) and small.backbone.conv1.stride == (1, 1)
    assert small(torch.randn(2, 1, 28, 28))["main"].shape == (2, 3)


@pytest.mark.parametrize("kw, message", [
    ({"stem": "huge"}, "unknown stem"),
    ({"backbone": "densenet121", "stem": "small"}, "applies to the ResNet"),
])
def test_bad_stems_are_user_errors(kw, message):
    with pytest.raises(UserError, match=message):
        tiny(**kw)
