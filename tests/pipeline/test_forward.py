"""Forward passes without training (fedcxr.pipeline.forward): probabilities over a loader, the quick AUROC."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from fedcxr.pipeline.data import make_loader
from fedcxr.pipeline.forward import predict, quick_auroc

from .test_local import CLASSES, toy_dataset, toy_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_predict_outputs_and_quick_auroc():
    ds = toy_dataset(n=12)
    model = toy_model()
    model.train()
    out = predict(model, make_loader(ds, batch_size=5, shuffle=False, seed=0, augment=False), device="cpu")
    assert model.training  # mode restored
    assert out["probs"].shape == (12, 2) and ((out["probs"] > 0) & (out["probs"] < 1)).all()
    assert out["aux_probs"]["sex"].shape == (12, 2)
    assert np.allclose(out["aux_probs"]["sex"].sum(1), 1.0, atol=1e-5)
    assert out["index"].tolist() == list(range(12))
    np.testing.assert_array_equal(out["label_mask"], ds.label_mask)
    auc = quick_auroc(out["labels"], out["label_mask"], out["probs"], CLASSES)
    assert auc["edema"] == pytest.approx(roc_auc_score(ds.labels[:, 0], out["probs"][:, 0]))
    observed = ds.label_mask[:, 1] > 0
    assert auc["atelectasis"] == pytest.approx(roc_auc_score(ds.labels[observed, 1], out["probs"][observed, 1]))
    one_valued = quick_auroc(np.ones((4, 1)), np.ones((4, 1)), np.random.rand(4, 1), ["edema"])
    assert math.isnan(one_valued["edema"])
