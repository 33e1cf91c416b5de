"""Round protocols, selectable by the papers' method names (DESIGN §5, §8; docs/methods.md).

A protocol only decides who trains, on what, and which pure rule of
:mod:`fedcxr.pipeline.aggregate` combines the replies; it talks to sites through a
:class:`~fedcxr.pipeline.transport.Transport`, so the in-process simulation and NVIDIA FLARE
run the very same code (STYLE: Flower's strategy base + one strategy per file).

A method is one module: its protocol class, its options (``options_key``/``Options``), its site
tasks and their share of the task envelope (``site_tasks``), and its names (``METHODS``). The
registry (:mod:`~fedcxr.pipeline.protocols.methods`) is derived from the modules; a method outside
fedcxr loads by ``method: path/to/file.py:Name``.

=====================  ====================================================================
module                 methods
=====================  ====================================================================
``methods``            the registry: built-in names (discovered), references to methods
                       outside fedcxr, option models and site tasks derived from them
``spec``               what a method module declares: ``MethodOptions``, ``SiteTask``,
                       ``method(...)``
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
``personal``           what the personalised methods share (each site's own model on its own
                       test split; personal layers)
``ditto``, ``fedrep``, personalised federated learning, one method each (PFLlib's and
``fedper``, ``apfl``,  pFL-Bench's reference set): each module is the only one naming its
``fedbabu``            method
=====================  ====================================================================

What the rest of fedcxr needs to know about a method is a property of its protocol, never a test
of its name: :attr:`RoundProtocol.pooled_site` (Central), :attr:`RoundProtocol.per_site_heads`
(FL_Surgical, PFL), :attr:`RoundProtocol.averages_sites`, ``needs_target``/``needs_target_labels``;
its defaults (optimiser, batch sizes, warm-up, ...) are :meth:`RoundProtocol.task_defaults` and
the class attributes beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

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
from fedcxr.pipeline.protocols.methods import DEFAULT_METHOD, METHODS, method_name, resolve

__all__ = [
    "CENTRAL_SITE", "Context", "DEFAULT_METHOD", "METHODS", "RoundFailed", "RoundProtocol", "REGISTRY", "ask",
    "ask_one", "get_protocol", "task_config", "valid_replies",
]


class _Factories(Mapping):
    """method name → protocol factory, derived from :data:`METHODS` (kept for scripts that iterate it)."""

    def __getitem__(self, name: str) -> Callable[[str], RoundProtocol]:
        return METHODS[name].build

    def __iter__(self):
        return iter(METHODS)

    def __len__(self) -> int:
        return len(METHODS)


#: method name → its protocol's factory (derived from the method modules' ``METHODS``)
REGISTRY: Mapping[str, Callable[[str], RoundProtocol]] = _Factories()


def get_protocol(name: str) -> RoundProtocol:
    """The protocol of a config's ``method``: a built-in name or a reference to a method outside
    fedcxr (``file.py:Name``); exit-2 error listing the known names otherwise."""
    return resolve(name).build(method_name(name))
