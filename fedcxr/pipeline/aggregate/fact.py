"""FACT's inter-domain distance (FACT Eq. 1), the quantity its target step minimises.

FACT's server averages with :func:`fedcxr.pipeline.aggregate.mean.fedavg`; what is its own is
this distance between two source heads' predictions on the same target images
(:mod:`fedcxr.pipeline.protocols.fact` runs the rounds).
"""

from __future__ import annotations

import torch

from fedcxr.pipeline.state import _shape

__all__ = ["idd"]


def idd(probs_a: torch.Tensor, probs_b: torch.Tensor) -> torch.Tensor:
    """FACT inter-domain distance: mean ``|p_a − p_b|`` (FACT Eq. 1; DESIGN §5).

    ``probs_a``, ``probs_b``: the two source heads' probabilities on the same target images,
    shape ``(batch, classes)`` (sigmoid outputs for multi-label; the caller applies it). The
    paper's ``E_x‖F1 − F2‖₁`` is averaged here over classes too (DESIGN: "mean |p1 − p2|"),
    so the value lies in [0, 1] whatever the number of classes. Differentiable: FACT's
    target step minimises it with respect to the feature extractor. Returns a 0-dim tensor.
    """
    if probs_a.shape != probs_b.shape:
        raise ValueError(f"idd: shapes differ: {_shape(probs_a)} vs {_shape(probs_b)}")
    if probs_a.numel() == 0:
        raise ValueError("idd: empty inputs")
    return (probs_a - probs_b).abs().mean()
