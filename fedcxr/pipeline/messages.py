"""What travels between the server and a site: the reply type and the payload layouts (a leaf).

Nothing here imports the rest of the pipeline, so protocols, transports and site runners all
point down at this module and never at each other (STYLE: MONAI ``fl/utils/exchange_object``).

* :class:`Reply` — what one site sends back for one task: parameters, counts, class names,
  metrics. Never images, labels or identifiers.
* Payload layouts of the tasks whose parameters are more than one model:
  ``train_combine`` (θ0 plus every source delta: :func:`pack_combine` / :func:`unpack_combine`)
  and ``fact_target`` (G' plus two heads under :data:`FACT_HEAD_A` / :data:`FACT_HEAD_B`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

StateDict = dict[str, torch.Tensor]

#: ``train_combine`` payload: source ``i``'s delta lives under ``source<i>.<key>``.
SOURCE_PREFIX = "source"
#: ``fact_target`` payload: the two source heads beside the averaged feature extractor G'.
FACT_HEAD_A, FACT_HEAD_B = "fact_head_a.", "fact_head_b."


@dataclass
class Reply:
    """What one site sends back for one task."""

    site: str
    params: Optional[StateDict] = None
    n_samples: int = 0
    n_batches: int = 0
    class_set: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def pack_combine(theta0: StateDict, deltas: list[StateDict]) -> StateDict:
    """θ0 plus each source delta under ``source<i>.`` (the ``train_combine`` payload)."""
    payload = dict(theta0)
    for i, delta in enumerate(deltas):
        payload.update({f"{SOURCE_PREFIX}{i}.{k}": v for k, v in delta.items()})
    return payload


def unpack_combine(payload: StateDict, n_sources: int) -> tuple[StateDict, list[StateDict]]:
    """Inverse of :func:`pack_combine`."""
    prefixes = [f"{SOURCE_PREFIX}{i}." for i in range(n_sources)]
    theta0 = {k: v for k, v in payload.items() if not k.startswith(tuple(prefixes))}
    deltas = [{k[len(p):]: v for k, v in payload.items() if k.startswith(p)} for p in prefixes]
    return theta0, deltas
