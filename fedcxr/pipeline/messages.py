"""What travels between the server and a site: the reply type and the payload layouts (a leaf).

Nothing here imports the rest of the pipeline, so protocols, transports and site runners all
point down at this module and never at each other (STYLE: MONAI ``fl/utils/exchange_object``).

* :class:`Reply` — what one site sends back for one task: parameters, counts, class names,
  metrics. Never images, labels or identifiers.
* Payload layouts of the tasks whose parameters are more than one model:
  ``train_combine`` (θ0 plus every source delta: :func:`pack_combine` / :func:`unpack_combine`)
  and ``fact_target`` (G' plus two heads under :data:`FACT_HEAD_A` / :data:`FACT_HEAD_B`);
  ``train_scaffold`` (the model plus SCAFFOLD's server control variate c: :func:`pack_control` /
  :func:`unpack_control`; the reply's extra tensors carry Δc_i: :func:`pack_control_delta` /
  :func:`unpack_control_delta`).
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
#: ``train_scaffold`` payload: the server's control variate c under ``scaffold_c.<key>`` beside the model.
SERVER_CONTROL_PREFIX = "scaffold_c."
#: ``train_scaffold`` reply: the site's control-variate update Δc_i under ``scaffold_dc.<key>`` (extra tensors).
CONTROL_DELTA_PREFIX = "scaffold_dc."


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


def pack_control(theta: StateDict, control: StateDict) -> StateDict:
    """The model plus SCAFFOLD's c under ``scaffold_c.`` (the ``train_scaffold`` payload)."""
    payload = dict(theta)
    payload.update({SERVER_CONTROL_PREFIX + k: v for k, v in control.items()})
    return payload


def unpack_control(payload: StateDict) -> tuple[StateDict, StateDict]:
    """Inverse of :func:`pack_control`: ``(model, c)``."""
    n = len(SERVER_CONTROL_PREFIX)
    theta = {k: v for k, v in payload.items() if not k.startswith(SERVER_CONTROL_PREFIX)}
    control = {k[n:]: v for k, v in payload.items() if k.startswith(SERVER_CONTROL_PREFIX)}
    return theta, control


def pack_control_delta(delta: StateDict) -> dict[str, torch.Tensor]:
    """Δc_i as reply extra tensors under ``scaffold_dc.``."""
    return {CONTROL_DELTA_PREFIX + k: v for k, v in delta.items()}


def unpack_control_delta(extra: dict[str, torch.Tensor]) -> StateDict:
    """Inverse of :func:`pack_control_delta` (other extra tensors are left out)."""
    n = len(CONTROL_DELTA_PREFIX)
    return {k[n:]: v for k, v in extra.items() if k.startswith(CONTROL_DELTA_PREFIX)}
