"""Round protocols, selectable by the papers' method names (DESIGN §5, §8).

A protocol only decides who trains, on what, and which pure rule of
:mod:`fedcxr.pipeline.aggregate` combines the replies; it talks to sites through a
:class:`~fedcxr.pipeline.transport.Transport`, so the in-process simulation and NVIDIA FLARE
run the very same code (STYLE: Flower's strategy base + one strategy per file).

=====================  ====================================================================
module                 methods
=====================  ====================================================================
``base``               the framework: :class:`Context`, :func:`ask`, reply checks, the base
                       :class:`RoundProtocol`
``fedavg``             ``FedAvg``, ``FedAvg_Finetune``, ``FedAvg_Finetune_AuxInfo``,
                       ``Source_Only``, ``Finetune_Offline``
``target_combine``     ``FedAvg_Finetune_GP``, ``FedAvg_Finetune_AuxInfo_GP``, ``FedDA``,
                       ``FedGP``, ``FedDA_Auto``, ``FedGP_Auto``
``surgical``           ``FL``, ``FL_PartialLoss``, ``FL_Surgical``, ``PFL``
``baselines``          ``Target_Only``, ``Oracle``, ``Central``, ``Individual``
``fact``               ``FACT``, ``FACT_NF``
``fedopt``             ``FedProx``, ``SCAFFOLD``, ``FedAdagrad``, ``FedAdam``, ``FedYogi`` (each
                       also ``_Finetune``): the reviewers' baselines
=====================  ====================================================================
"""

from __future__ import annotations

from typing import Callable

from fedcxr.errors import UserError
from fedcxr.pipeline.protocols.base import (
    CENTRAL_SITE,
    Context,
    RoundFailed,
    RoundProtocol,
    ask,
    ask_one,
    task_config,
    valid_replies,
)
from fedcxr.pipeline.protocols.baselines import CentralProtocol, IndividualProtocol, TargetOnlyProtocol
from fedcxr.pipeline.protocols.fact import FACTProtocol
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol, FinetuneOfflineProtocol, SourceOnlyProtocol
from fedcxr.pipeline.protocols.fedopt import FedOptProtocol, FedProxProtocol, SCAFFOLDProtocol
from fedcxr.pipeline.protocols.surgical import SurgicalFamilyProtocol
from fedcxr.pipeline.protocols.target_combine import FedDAGPProtocol, GPProtocol

__all__ = [
    "CENTRAL_SITE", "Context", "RoundFailed", "RoundProtocol", "REGISTRY", "ask", "ask_one",
    "get_protocol", "task_config", "valid_replies",
]

REGISTRY: dict[str, Callable[[str], RoundProtocol]] = {
    "FedAvg": lambda n: FedAvgProtocol(n, finetune=False, aux_info=False),
    "FedAvg_Finetune": lambda n: FedAvgProtocol(n, finetune=True, aux_info=False),
    "FedAvg_Finetune_AuxInfo": lambda n: FedAvgProtocol(n, finetune=True, aux_info=True),
    "FedAvg_Finetune_GP": lambda n: GPProtocol(n, aux_info=False),
    "FedAvg_Finetune_AuxInfo_GP": lambda n: GPProtocol(n, aux_info=True),
    "Oracle": lambda n: TargetOnlyProtocol(n, oracle=True),
    "Source_Only": SourceOnlyProtocol,
    "Finetune_Offline": FinetuneOfflineProtocol,
    "FedDA": lambda n: FedDAGPProtocol(n, rule="fedda", auto=False),
    "FedGP": lambda n: FedDAGPProtocol(n, rule="fedgp", auto=False),
    "FedDA_Auto": lambda n: FedDAGPProtocol(n, rule="fedda", auto=True),
    "FedGP_Auto": lambda n: FedDAGPProtocol(n, rule="fedgp", auto=True),
    "Target_Only": lambda n: TargetOnlyProtocol(n, oracle=False),
    "Individual": IndividualProtocol,
    "PFL": lambda n: SurgicalFamilyProtocol(n, mode="pfl"),
    "Central": CentralProtocol,
    "FL": lambda n: SurgicalFamilyProtocol(n, mode="fl"),
    "FL_PartialLoss": lambda n: SurgicalFamilyProtocol(n, mode="partial"),
    "FL_Surgical": lambda n: SurgicalFamilyProtocol(n, mode="surgical"),
    "FACT": lambda n: FACTProtocol(n, finetune=True),
    "FACT_NF": lambda n: FACTProtocol(n, finetune=False),
    # the reviewers' baselines (protocols/fedopt.py); _Finetune: the target fine-tunes as FedAvg_Finetune
    "FedProx": lambda n: FedProxProtocol(n, finetune=False),
    "FedProx_Finetune": lambda n: FedProxProtocol(n, finetune=True),
    "SCAFFOLD": lambda n: SCAFFOLDProtocol(n, finetune=False),
    "SCAFFOLD_Finetune": lambda n: SCAFFOLDProtocol(n, finetune=True),
    "FedAdagrad": lambda n: FedOptProtocol(n, rule="adagrad", finetune=False),
    "FedAdagrad_Finetune": lambda n: FedOptProtocol(n, rule="adagrad", finetune=True),
    "FedAdam": lambda n: FedOptProtocol(n, rule="adam", finetune=False),
    "FedAdam_Finetune": lambda n: FedOptProtocol(n, rule="adam", finetune=True),
    "FedYogi": lambda n: FedOptProtocol(n, rule="yogi", finetune=False),
    "FedYogi_Finetune": lambda n: FedOptProtocol(n, rule="yogi", finetune=True),
}


def get_protocol(name: str) -> RoundProtocol:
    """The protocol for a method name; exit-2 error listing the known names otherwise."""
    if name not in REGISTRY:
        raise UserError(f"unknown strategy {name!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[name](name)
