"""The local optimiser of a site: built from the task's settings, and its state kept across rounds.

The authors' code differs per method (DESIGN §5): AuxInfo+GP and AutoFedGP build a fresh Adam in
every round, the surgical aggregation code keeps each client's Keras Adam for the whole run,
FACT keeps each client's SGD. A kept state travels in the site's local state as plain tensors
(:func:`optimizer_state_dict` / :func:`load_optimizer_state`), so a checkpoint holds it and a
resume continues it exactly.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import nn

from fedcxr.errors import UserError

OPTIMIZERS = ("adam", "adamw", "sgd")


def make_optimizer(params: list[torch.nn.Parameter], *, optimizer: str, lr: float, weight_decay: float = 0.0,
                   momentum: float = 0.9) -> torch.optim.Optimizer:
    """``adam`` | ``adamw`` | ``sgd`` (with ``momentum``) over ``params``; an unknown name is a user error."""
    name = optimizer.lower()
    if name == "adam":
        # foreach: one fused update over all tensors (torch picks the slow per-tensor loop on CPU)
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise UserError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")


def optimizer_state_dict(optimizer: torch.optim.Optimizer,
                         named: Sequence[tuple[str, nn.Parameter]]) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state as ``{"<name>.<field>": tensor}`` on CPU.

    Tensors only (Adam's ``step``, ``exp_avg``, ``exp_avg_sq``; SGD's ``momentum_buffer``), so
    it travels in a site's local state and loads with ``torch.load(weights_only=True)``;
    learning rates are not part of it (each call sets its own, e.g. FACT's schedule).
    """
    out = {}
    for name, p in named:
        for field, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                out[f"{name}.{field}"] = value.detach().to("cpu", copy=True)
    return out


def load_optimizer_state(optimizer: torch.optim.Optimizer, named: Sequence[tuple[str, nn.Parameter]],
                         state: Mapping[str, torch.Tensor]) -> None:
    """Inverse of :func:`optimizer_state_dict` for the parameters this optimizer trains."""
    for name, p in named:
        prefix = name + "."
        fields = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and "." not in k[len(prefix):]}
        if not fields:
            continue
        optimizer.state[p] = {f: (v.clone() if f == "step" else v.to(p.device, copy=True)) for f, v in fields.items()}
