"""The persistor and model locator: FLARE's own tools find fedcxr's global model the FLARE way."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("nvflare")

from nvflare.apis.dxo import DataKind  # noqa: E402
from nvflare.app_common.abstract.model import make_model_learnable  # noqa: E402

from fedcxr.flare.persistor import (  # noqa: E402
    GLOBAL_MODEL_FILE,
    FedcxrModelLocator,
    FedcxrModelPersistor,
)


class _Ctx:
    """The two things the components ask FLARE's context for: the job's app folder, other components."""

    def __init__(self, app_dir: Path, components: dict):
        workspace = SimpleNamespace(get_app_dir=lambda job_id: str(app_dir / job_id / "app_server"))
        self.engine = SimpleNamespace(get_workspace=lambda: workspace, get_component=components.get)

    def get_engine(self):
        return self.engine

    def get_job_id(self):
        return "job1"


def test_the_global_model_is_saved_listed_and_located_in_flares_pytorch_format(tmp_path):
    persistor = FedcxrModelPersistor()
    ctx = _Ctx(tmp_path, {"persistor": persistor})
    locator = FedcxrModelLocator()
    assert persistor.load_model(ctx).is_empty() and locator.get_model_names(ctx) == []

    weights = {"conv.weight": np.random.rand(4, 1, 3, 3).astype(np.float32), "bn.num_batches_tracked": np.array(3)}
    persistor.save_model(make_model_learnable(weights=weights, meta_props={}), ctx)
    path = tmp_path / "job1" / "app_server" / GLOBAL_MODEL_FILE
    saved = torch.load(path, weights_only=True)  # what FLARE's PTFileModelPersistor writes: {"model": state}
    assert set(saved["model"]) == set(weights) and torch.equal(saved["model"]["conv.weight"],
                                                               torch.from_numpy(weights["conv.weight"]))
    assert locator.get_model_names(ctx) == [GLOBAL_MODEL_FILE]
    dxo = locator.locate_model(GLOBAL_MODEL_FILE, ctx)
    assert dxo.data_kind == DataKind.WEIGHTS and np.array_equal(dxo.data["conv.weight"], weights["conv.weight"])
    assert locator.locate_model("other.pt", ctx) is None
    assert np.array_equal(persistor.load_model(ctx)["weights"]["bn.num_batches_tracked"], 3)


def test_the_model_file_must_be_a_name_not_a_path():
    with pytest.raises(ValueError, match="file name"):
        FedcxrModelPersistor(model_file="../../outside.pt")
