"""The global model where FLARE's own tools look for it: a model persistor and a model locator.

fedcxr's run directory (``final_model.pt``, checkpoints) is the source of truth; these two FLARE
components only *expose* the result the FLARE way:

* :class:`FedcxrModelPersistor` (component id ``persistor``, what ``ModelController`` uses):
  the controller saves the final global model through it after each experiment
  (``ModelController.save_model``), written like FLARE's ``PTFileModelPersistor``: a
  ``torch.save`` of ``{"model": state dict}`` as ``FL_global_model.pt`` in the server's app
  folder of the job, so it is in the job's result (``nvflare job download``) and found by
  anything that reads FLARE's PyTorch convention. Its inventory (``get_model_inventory``) names it.
  It never supplies an initial model: fedcxr builds that from the experiment config (the same
  seed as in-process runs), and a resumed run continues from its own checkpoints.
* :class:`FedcxrModelLocator` (component id ``model_locator``): ``get_model_names`` /
  ``locate_model`` of the persisted models as FLARE ``DXO`` weights, what FLARE's
  cross-site evaluation workflows and model selectors use.

With several experiments in one job the file holds the last finished one (each run directory
keeps its own ``final_model.pt``). Both classes are in FLARE's default component allow list
only under their fedcxr names, so POC mode adds them to the server's ``class_allow_list``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from fedcxr.atomic import atomic_torch_save
from fedcxr.pipeline.checkpoints import load_tensors

try:
    from nvflare.apis.dxo import DXO, DataKind
    from nvflare.apis.fl_context import FLContext
    from nvflare.app_common.abstract.model import ModelLearnable, make_model_learnable
    from nvflare.app_common.abstract.model_locator import ModelLocator as _LocatorBase
    from nvflare.app_common.abstract.model_persistor import ModelPersistor as _PersistorBase
    from nvflare.app_common.model_desc import ModelDescriptor
except ImportError:  # pragma: no cover - only without the extra
    _LocatorBase = _PersistorBase = object
    FLContext = ModelLearnable = object  # type: ignore[misc,assignment]

GLOBAL_MODEL_FILE = "FL_global_model.pt"  # FLARE's PyTorch persistor's name for the global model
PERSISTOR_ID = "persistor"  # AppConstants.DEFAULT_PERSISTOR_ID
LOCATOR_ID = "model_locator"
PERSISTOR_PATH = "fedcxr.flare.persistor.FedcxrModelPersistor"
LOCATOR_PATH = "fedcxr.flare.persistor.FedcxrModelLocator"


def _app_dir(fl_ctx) -> Path:
    engine = fl_ctx.get_engine()
    return Path(engine.get_workspace().get_app_dir(fl_ctx.get_job_id()))


def to_numpy(state: dict) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}


class FedcxrModelPersistor(_PersistorBase):
    """``FL_global_model.pt`` in the server's app folder (FLARE's PyTorch persistor format)."""

    def __init__(self, model_file: str = GLOBAL_MODEL_FILE):
        super().__init__()
        if Path(model_file).name != model_file:
            raise ValueError(f"model_file {model_file!r} must be a file name, not a path")
        self.model_file = model_file

    def path(self, fl_ctx) -> Path:
        return _app_dir(fl_ctx) / self.model_file

    def load_model(self, fl_ctx) -> "ModelLearnable":
        """The persisted global model, or an empty one (fedcxr builds the initial model itself)."""
        path = self.path(fl_ctx)
        if not path.is_file():
            return make_model_learnable(weights={}, meta_props={})
        return self._learnable(path)

    def save_model(self, model: "ModelLearnable", fl_ctx) -> None:
        weights = model.get("weights") or {}
        state = {k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()}
        atomic_torch_save({"model": state}, self.path(fl_ctx))

    def get_model_inventory(self, fl_ctx) -> Dict[str, "ModelDescriptor"]:
        path = self.path(fl_ctx)
        if not path.is_file():
            return {}
        return {self.model_file: ModelDescriptor(name=self.model_file, location=str(path), model_format="PT",
                                                 props={})}

    def get_model(self, model_file: str, fl_ctx) -> Optional["ModelLearnable"]:
        inventory = self.get_model_inventory(fl_ctx)
        if model_file not in inventory:
            return None
        return self._learnable(Path(inventory[model_file].location))

    @staticmethod
    def _learnable(path: Path) -> "ModelLearnable":
        saved = load_tensors(path, "FLARE global model")
        return make_model_learnable(weights=to_numpy(saved["model"]), meta_props={})


class FedcxrModelLocator(_LocatorBase):
    """FLARE's model locator over :class:`FedcxrModelPersistor` (the models as ``DXO`` weights)."""

    def __init__(self, persistor_id: str = PERSISTOR_ID):
        super().__init__()
        self.persistor_id = persistor_id

    def _persistor(self, fl_ctx) -> FedcxrModelPersistor:
        persistor = fl_ctx.get_engine().get_component(self.persistor_id)
        if not isinstance(persistor, FedcxrModelPersistor):
            raise ValueError(f"component {self.persistor_id!r} is not a FedcxrModelPersistor")
        return persistor

    def get_model_names(self, fl_ctx) -> List[str]:
        return list(self._persistor(fl_ctx).get_model_inventory(fl_ctx))

    def locate_model(self, model_name, fl_ctx) -> Optional["DXO"]:
        learnable = self._persistor(fl_ctx).get_model(model_name, fl_ctx)
        if learnable is None:
            return None
        return DXO(data_kind=DataKind.WEIGHTS, data=learnable["weights"])
