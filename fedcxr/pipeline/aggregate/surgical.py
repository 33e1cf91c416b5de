"""Surgical aggregation of classification heads (surgical-aggregation paper, Eq. 2-3, Alg. 1).

Each client's head holds rows for its own class set only; the global row of a class is the
unweighted mean over the clients that have it, matched by class name. The backbone is averaged by
:func:`fedcxr.pipeline.aggregate.mean.fedavg` or ``fedbn`` (Eq. 1), not here.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch

from fedcxr.pipeline.state import StateDict, _compute_dtype, _shape

__all__ = ["surgical_heads"]


def surgical_heads(
    heads: Sequence[Mapping[str, torch.Tensor]],
    class_sets: Sequence[Sequence[str]],
    classes: Sequence[str],
    previous: Optional[Mapping[str, torch.Tensor]] = None,
) -> tuple[StateDict, list[StateDict]]:
    """Surgical aggregation of classification heads (surgical-aggregation paper, Eq. 2-3, Alg. 1).

    ``heads[i] = {"weight": (|C_i|, F), "bias": (|C_i|,)}`` with rows in ``class_sets[i]``
    order; ``classes`` is the global order. For each class c, the global row and bias of c
    are the UNWEIGHTED mean over the clients whose class set contains c, matched by class
    name (never by position). A class no client has keeps ``previous``'s row and bias
    (``previous = {"weight": (|classes|, F), "bias": (|classes|,)}``); with ``previous=None``
    that is an error (``ValueError`` naming the classes) rather than a silent zero row.

    Returns ``(global_head, per_client_heads)``; ``per_client_heads[i]`` holds the new rows
    of ``class_sets[i]`` in that client's own order (what the paper sends back to client i).
    """
    if len(heads) != len(class_sets):
        raise ValueError(f"surgical_heads: {len(heads)} heads but {len(class_sets)} class sets")
    if len(set(classes)) != len(classes):
        raise ValueError("surgical_heads: duplicate names in the global classes")
    position = {c: i for i, c in enumerate(classes)}
    indices = [_client_rows(i, head, cs, position) for i, (head, cs) in enumerate(zip(heads, class_sets))]
    features = _feature_size(heads, previous, len(classes))
    dtype, device = _head_dtype_device(heads, previous)
    cd = _compute_dtype(dtype)
    w_sum = torch.zeros(len(classes), features, dtype=cd, device=device)
    b_sum = torch.zeros(len(classes), dtype=cd, device=device)
    count = torch.zeros(len(classes), dtype=cd, device=device)
    for head, idx in zip(heads, indices):
        idx = idx.to(device)
        w_sum.index_add_(0, idx, head["weight"].detach().to(device=device, dtype=cd))
        b_sum.index_add_(0, idx, head["bias"].detach().to(device=device, dtype=cd))
        count.index_add_(0, idx, torch.ones(len(idx), dtype=cd, device=device))
    covered = count > 0
    weight = w_sum / count.clamp_min(1).unsqueeze(1)
    bias = b_sum / count.clamp_min(1)
    if not bool(covered.all()):
        orphans = [c for c, ok in zip(classes, covered.tolist()) if not ok]
        if previous is None:
            raise ValueError(f"surgical_heads: no client has class(es) {orphans} and no previous head was given")
        weight = torch.where(covered.unsqueeze(1), weight, previous["weight"].detach().to(device=device, dtype=cd))
        bias = torch.where(covered, bias, previous["bias"].detach().to(device=device, dtype=cd))
    global_head = {"weight": weight.to(dtype), "bias": bias.to(dtype)}
    per_client = [
        {"weight": global_head["weight"].index_select(0, idx.to(device)),
         "bias": global_head["bias"].index_select(0, idx.to(device))}
        for idx in indices
    ]
    return global_head, per_client


def _client_rows(i: int, head: Mapping[str, torch.Tensor], class_set: Sequence[str], position: Mapping[str, int]) -> torch.Tensor:
    """Global row index of each of client i's rows; validates names and shapes."""
    for part in ("weight", "bias"):
        if part not in head:
            raise ValueError(f"surgical_heads: client {i}'s head has no {part!r}")
    if len(set(class_set)) != len(class_set):
        raise ValueError(f"surgical_heads: client {i} lists a class twice: {list(class_set)}")
    unknown = [c for c in class_set if c not in position]
    if unknown:
        raise ValueError(f"surgical_heads: client {i} has class(es) {unknown} not in the global classes")
    w, b = head["weight"], head["bias"]
    if w.dim() != 2 or w.shape[0] != len(class_set) or _shape(b) != (len(class_set),):
        raise ValueError(
            f"surgical_heads: client {i} has {len(class_set)} classes but head shapes "
            f"weight {_shape(w)}, bias {_shape(b)}"
        )
    return torch.tensor([position[c] for c in class_set], dtype=torch.long)


def _feature_size(heads: Sequence[Mapping[str, torch.Tensor]], previous: Optional[Mapping[str, torch.Tensor]], n_classes: int) -> int:
    sizes = {int(h["weight"].shape[1]) for h in heads}
    if previous is not None:
        if _shape(previous["bias"]) != (n_classes,) or previous["weight"].dim() != 2 or previous["weight"].shape[0] != n_classes:
            raise ValueError(
                f"surgical_heads: previous head must be ({n_classes}, F) and ({n_classes},), got "
                f"{_shape(previous['weight'])} and {_shape(previous['bias'])}"
            )
        sizes.add(int(previous["weight"].shape[1]))
    if len(sizes) != 1:
        raise ValueError(f"surgical_heads: heads disagree on the feature size: {sorted(sizes)}")
    return sizes.pop()


def _head_dtype_device(heads, previous) -> tuple[torch.dtype, torch.device]:
    if heads:
        return heads[0]["weight"].dtype, heads[0]["weight"].device
    if previous is not None:
        return previous["weight"].dtype, previous["weight"].device
    raise ValueError("surgical_heads: no heads and no previous head")
