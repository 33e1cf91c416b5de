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


def fresh_optimizer(model: nn.Module, params: list[torch.nn.Parameter], *, optimizer: str, lr: float,
                    weight_decay: float = 0.0, momentum: float = 0.9) -> torch.optim.Optimizer:
    """What :func:`make_optimizer` builds, starting from no state — the one ``model`` kept from its
    last call with the same parameters and settings, its state cleared and its lr set, where there is one.

    Why: building a torch optimizer costs milliseconds (its param group checks, hooks, step
    wrappers), paid by every simulated site every round; a hundred sites share one network
    (:mod:`fedcxr.pipeline.model_pool`), so they can share its optimizer too. Cleared, it is the
    fresh one: Adam and SGD create their per-parameter state at their first step from nothing, as
    a new optimizer does (``tests/pipeline/test_optimizers.py``: the same weights bit for bit).
    One optimizer is kept per model (its state: the moments of its last call, as big as the
    trained parameters twice over for Adam); a call with other parameters or settings replaces it.
    """
    name = optimizer.lower()
    key = (tuple(id(p) for p in params), name, float(weight_decay), float(momentum) if name == "sgd" else None)
    kept = model.__dict__.get("_fedcxr_optimizer")
    if kept is not None and kept[0] == key:
        made = kept[1]
        made.state.clear()
        for group in made.param_groups:
            group["lr"] = lr
        return made
    made = make_optimizer(params, optimizer=optimizer, lr=lr, weight_decay=weight_decay, momentum=momentum)
    model.__dict__["_fedcxr_optimizer"] = (key, made)
    return made


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
