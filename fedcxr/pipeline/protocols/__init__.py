"""Round protocols, selectable by the papers' method names (DESIGN §5, §8).

A protocol only decides who trains, on what, and which pure rule of
:mod:`fedcxr.pipeline.aggregate` combines the replies; it talks to sites through a
:class:`~fedcxr.pipeline.transport.Transport`, so the in-process simulation and NVIDIA FLARE
run the very same code (STYLE: Flower's strategy base + one strategy per file).

=====================  ====================================================================
module                 methods
=====================  ====================================================================
``methods``            the table of method names → protocol class and options (a leaf: the
                       config checks names against it when it is loaded)
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

What the rest of fedcxr needs to know about a method is a property of its protocol, never a test
of its name: :attr:`RoundProtocol.pooled_site` (Central), :attr:`RoundProtocol.per_site_heads`
(FL_Surgical, PFL), :attr:`RoundProtocol.averages_sites`, ``needs_target``/``needs_target_labels``;
its defaults (optimiser, batch sizes, warm-up, ...) are :meth:`RoundProtocol.task_defaults` and
the class attributes beside it.
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
from fedcxr.pipeline.protocols.methods import DEFAULT_METHOD, METHODS, unknown_method
from fedcxr.pipeline.protocols.surgical import SurgicalFamilyProtocol
from fedcxr.pipeline.protocols.target_combine import FedDAGPProtocol, GPProtocol

__all__ = [
    "CENTRAL_SITE", "Context", "DEFAULT_METHOD", "METHODS", "RoundFailed", "RoundProtocol", "REGISTRY", "ask",
    "ask_one", "get_protocol", "task_config", "valid_replies",
]

_CLASSES: dict[str, type[RoundProtocol]] = {cls.__name__: cls for cls in (
    FedAvgProtocol, SourceOnlyProtocol, FinetuneOfflineProtocol, GPProtocol, FedDAGPProtocol, TargetOnlyProtocol,
    CentralProtocol, IndividualProtocol, SurgicalFamilyProtocol, FACTProtocol, FedProxProtocol, SCAFFOLDProtocol,
    FedOptProtocol)}


def _factory(cls: type[RoundProtocol], options: dict) -> Callable[[str], RoundProtocol]:
    return lambda name: cls(name, **options)


#: method name → its protocol's factory (the :data:`~fedcxr.pipeline.protocols.methods.METHODS` table)
REGISTRY: dict[str, Callable[[str], RoundProtocol]] = {
    name: _factory(_CLASSES[cls], options) for name, (cls, options) in METHODS.items()}


def get_protocol(name: str) -> RoundProtocol:
    """The protocol for a method name; exit-2 error listing the known names otherwise."""
    if name not in REGISTRY:
        raise UserError(unknown_method(name))
    return REGISTRY[name](name)
