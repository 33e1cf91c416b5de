"""The local loss of every method (DESIGN §5 'Local loss (AuxInfo)'): pure functions of a batch's outputs.

``L = L_main + α · Σ_k L_aux_k`` (``aux_reduction: sum``, the AuxInfo+GP paper's Eq. 2-3), or
``L_main + α · mean_k L_aux_k`` (``aux_reduction: mean``: the mean over the tasks with a known row
in the batch, so α weighs the auxiliary loss the same whatever the number of tasks):

* ``L_main`` (:func:`masked_bce`): BCE-with-logits over the observed entries of the batch only
  (``label_mask``), averaged over those entries — a site that does not label a class, or a row
  whose label is missing, adds nothing;
* ``L_aux_k`` (:func:`aux_ce`): cross-entropy of aux task ``k`` over the rows whose value is known;
* FedProx adds :func:`proximal_term` (``μ/2·‖w − w^t‖²``).

The training loop (:mod:`fedcxr.pipeline.local`) sums them; logits go in, never sigmoid outputs.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
import torch.nn.functional as F


def masked_bce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean BCE-with-logits over entries where ``mask`` > 0; ``(B, C)`` inputs, scalar out.

    A batch with no observed entry gives 0 that still has a ``grad_fn`` (backward gives zero
    gradients, never NaN).
    """
    per_entry = F.binary_cross_entropy_with_logits(logits.float(), targets.float(), reduction="none")
    observed = mask > 0
    total = torch.where(observed, per_entry, torch.zeros_like(per_entry)).sum()
    return total / observed.sum().clamp_min(1)


AUX_REDUCTIONS = ("sum", "mean")


def aux_ce(
    aux_logits: Mapping[str, torch.Tensor],
    aux: torch.Tensor,
    aux_mask: torch.Tensor,
    tasks: Sequence[str],
    reduction: str = "sum",
) -> torch.Tensor:
    """``Σ_k`` (``reduction="sum"``) or mean over ``k`` (``"mean"``) of task ``k``'s mean cross-entropy
    over the rows whose code is known.

    ``aux_logits[task]``: (B, K_task) logits; ``aux``: (B, T) int64 codes (-1 unknown) in
    ``tasks`` order; ``aux_mask``: (B, T), 1 where known. A task with no known row adds 0 and, under
    ``mean``, is not counted: a site that never records race (NIH) averages its other tasks, so
    its auxiliary loss is not scaled down for a label it does not have.
    """
    if reduction not in AUX_REDUCTIONS:
        raise ValueError(f"aux reduction {reduction!r}: choose one of {', '.join(AUX_REDUCTIONS)}")
    total: Optional[torch.Tensor] = None
    present: Optional[torch.Tensor] = None
    for t, task in enumerate(tasks):
        logits = aux_logits[task].float()
        target = aux[:, t].long()
        known = (aux_mask[:, t] > 0) & (target >= 0)
        per_row = F.cross_entropy(logits, target.clamp_min(0), reduction="none")
        term = torch.where(known, per_row, torch.zeros_like(per_row)).sum() / known.sum().clamp_min(1)
        total = term if total is None else total + term
        has = known.any().float()
        present = has if present is None else present + has
    if total is None:
        return torch.zeros((), device=aux.device)
    if reduction == "mean":
        return total / present.clamp_min(1)
    return total


def proximal_term(params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx's proximal term ``(μ/2)·‖w − w^t‖²`` (Li et al. 2020, MLSys, Eq. 2), a 0-dim tensor.

    ``params``: the trainable parameters w (BatchNorm running statistics are buffers, not
    parameters, so they are not in it, as in Flower's and NVFLARE's FedProx); ``anchors``: the
    same parameters as the site received them this round (w^t, no gradient). Summed in float32.
    Flower's ``FedProx`` docstring adds ``(w − w^t).norm(2)`` unsquared; the paper, NVFLARE's
    ``PTFedProxLoss`` and Flower's FedProx baseline square it, as here.
    """
    if len(params) != len(anchors):
        raise ValueError(f"proximal_term: {len(params)} parameters but {len(anchors)} anchors")
    if not params:
        return torch.zeros(())
    total = torch.stack([(p.float() - a.float()).square().sum() for p, a in zip(params, anchors)]).sum()
    return total * (float(mu) / 2.0)
