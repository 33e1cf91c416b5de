"""Grad-CAM overlays (monai.visualize.GradCAM on the backbone's last block)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fedcxr.models.network import CXRNet
from fedcxr.pipeline.explain import grad_cam, write_overlays
from fedcxr.pipeline.inference import preprocess

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_grad_cam_is_a_unit_map_per_class(tmp_path):
    torch.manual_seed(0)
    model = CXRNet(["edema", "pneumonia"], backbone="resnet_tiny", hidden=None).eval()
    with torch.no_grad():
        model.head.weight[1] = -model.head.weight[0]  # pneumonia: the opposite evidence of edema
    image = torch.randn(1, 128, 128)
    a, b = grad_cam(model, image, 0, torch.device("cpu")), grad_cam(model, image, 1, torch.device("cpu"))
    assert a.shape == b.shape == (128, 128) and a.dtype == np.float32
    assert all(m.min() >= 0.0 and m.max() <= 1.0 for m in (a, b))
    assert max(a.std(), b.std()) > 0.05  # the class with positive evidence lights up somewhere
    assert not np.allclose(a, b)
    assert all(p.grad is None for p in model.parameters())  # explaining does not train


def test_overlays_of_the_top_images_per_class_are_named_by_key(tmp_path):
    torch.manual_seed(1)
    model = CXRNet(["edema", "pneumonia"], backbone="resnet_tiny", hidden=8).eval()
    rng = np.random.default_rng(0)
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"patient_{i}.png")
        Image.fromarray(rng.integers(0, 256, (48, 40), dtype=np.uint8), "L").save(paths[-1])
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.7]], dtype=np.float32)
    files = write_overlays(model, paths, ["k0", "k1", "k2"], probs, model.classes, tmp_path / "cam", size=32,
                           top_n=2, device=torch.device("cpu"))
    assert sorted(p.relative_to(tmp_path / "cam").as_posix() for p in files) == [
        "edema/k0.png", "edema/k2.png", "pneumonia/k1.png", "pneumonia/k2.png"]
    assert all(Image.open(p).size[0] > 200 for p in files)
    assert preprocess(paths[0], 32).shape == (1, 32, 32)
