"""GP / FedDA / FedGP applied from a round's spec: the glue between a task config and the pure rules.

The round protocol (:mod:`fedcxr.pipeline.protocols.target_combine`) describes the sources in
a ``combine`` spec — counts, learning rates, batch sizes, epochs, the rule and β — and the
party that combines (today the target site, DESIGN §8) calls :func:`combine` with its own
fine-tuned model. Only the pure functions of :mod:`fedcxr.pipeline.aggregate` do arithmetic.
"""

from __future__ import annotations

from typing import Optional

import torch

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.state import StateDict, apply_delta, flatten_state, update_keys

RULES = ("gp", "fedda", "fedgp")
#: Entries whose per-step change does not scale with the learning rate (BN: momentum·(batch − running)):
#: left unscaled by the alignment and out of the auto-β estimators (:func:`auto_estimates`).
UNSCALED_SUFFIXES = ("running_mean", "running_var")


def combine(theta0: StateDict, target: StateDict, deltas: list[StateDict], spec: dict, *,
            n_target: int, batch_updates: Optional[torch.Tensor],
            target_steps: Optional[int] = None) -> tuple[StateDict, list[float]]:
    """Apply the round's rule (``spec["rule"]``: gp | fedda | fedgp) to the target's update.

    ``spec`` holds the sources' sample and batch counts, the learning rates, batch sizes and
    epochs, and either a fixed ``beta`` or ``auto: true`` (β_i from ``batch_updates``).
    ``target_steps`` (the target's optimiser steps) with ``spec["n_batches"]`` (each source's)
    makes the GP magnitude scale use the real step counts.
    Returns the combined model and the β used per source (:func:`combine_with_estimates` also
    returns the numbers behind them).
    """
    theta, betas, _ = combine_with_estimates(theta0, target, deltas, spec, n_target=n_target,
                                             batch_updates=batch_updates, target_steps=target_steps)
    return theta, betas


def combine_with_estimates(theta0: StateDict, target: StateDict, deltas: list[StateDict], spec: dict, *,
                           n_target: int, batch_updates: Optional[torch.Tensor],
                           target_steps: Optional[int] = None) -> tuple[StateDict, list[float], dict]:
    """:func:`combine`, plus what a round's metrics record about it (only counts and scalars):

    ``scales`` (gp, fedgp: the magnitude scale s_i of each source), ``kept`` and ``cos``
    (gp, fedgp: the share of the model's values in entries where source i is kept, c_i > 0, and
    the value-weighted mean of c_i), ``target_batches`` (B) and, auto-weighted, ``sigma2``,
    ``d2``, ``tau2d2`` (:func:`fedcxr.pipeline.aggregate.auto_betas`). Lists follow the sources.
    """
    sources = [apply_delta(theta0, d) for d in deltas]
    n_sources = [max(int(n), 1) for n in spec["n_sources"]]
    estimates: dict = {}
    if spec.get("auto"):
        auto = auto_estimates(theta0, deltas, spec, batch_updates)
        betas = [float(b) for b in auto["betas"]]
        estimates.update(sigma2=float(auto["sigma2"]), d2=[float(v) for v in auto["d2"]],
                         tau2d2=[float(v) for v in auto["tau2d2"]], target_batches=int(batch_updates.shape[0]))
    else:
        betas = [float(spec["beta"])] * len(sources)
    scale = dict(
        n_sources=n_sources, n_target=max(int(n_target), 1), bs_source=spec["bs_source"],
        bs_target=spec["bs_target"], lr_source=spec["lr_source"], lr_target=spec["lr_target"],
        epochs_source=spec["epochs_source"], epochs_target=spec["epochs_target"],
    )
    if target_steps and all(int(b) > 0 for b in spec.get("n_batches") or [0]):
        scale.update(steps_source=[int(b) for b in spec["n_batches"]], steps_target=int(target_steps))
    rule = spec["rule"]
    if rule not in RULES:
        raise ValueError(f"unknown combination rule {rule!r}; known: {', '.join(RULES)}")
    if rule in ("gp", "fedgp"):
        estimates.update(scales=agg.magnitude_scales(**scale), **projection_summary(theta0, target, sources))
    if rule == "gp":
        return agg.gp(theta0, target, sources, beta=betas[0], **scale), betas, estimates
    if rule == "fedda":
        return agg.fedda(theta0, target, sources, betas=betas, n_sources=n_sources), betas, estimates
    return agg.fedgp(theta0, target, sources, betas=betas, **scale), betas, estimates


def projection_summary(theta0: StateDict, target: StateDict, sources: list[StateDict]) -> dict:
    """Per source: ``kept`` = share of the model's values in entries where c_i > 0 (the source is
    projected there) and ``cos`` = the value-weighted mean of the per-entry c_i (GP Eq. 4)."""
    cosines = agg.projection_cosines(theta0, target, sources)
    sizes = {k: theta0[k].numel() for k in cosines}
    total = max(sum(sizes.values()), 1)
    kept = [sum(sizes[k] for k, c in cosines.items() if c[i] > 0) / total for i in range(len(sources))]
    mean = [sum(sizes[k] * c[i] for k, c in cosines.items()) / total for i in range(len(sources))]
    return {"kept": kept, "cos": mean}


def auto_betas(theta0: StateDict, deltas: list[StateDict], spec: dict,
               batch_updates: Optional[torch.Tensor]) -> list[float]:
    """Auto-weighting (DESIGN §5): the target's per-batch updates vs each source's per-batch update."""
    return [float(b) for b in auto_estimates(theta0, deltas, spec, batch_updates)["betas"]]


def auto_estimates(theta0: StateDict, deltas: list[StateDict], spec: dict,
                   batch_updates: Optional[torch.Tensor]) -> dict:
    """:func:`fedcxr.pipeline.aggregate.auto_betas` on the aligned target updates: β_i, σ², d², τ²d².

    Over the trained parameters only (:func:`estimator_keys`): BatchNorm running statistics are
    left out of g_j and s_i. Their per-step change is ``momentum·(batch statistic − running)``,
    not a gradient step: at a small target batch it is batch-to-batch noise orders of magnitude
    larger than a weight's step (measured on the shortcut shift: σ² 1.5e-7 with them, 6e-10
    without), so with them σ² and τ²d² measured BatchNorm noise and FedGP_Auto's β went to 1
    (BENCHMARKS.md, "FedGP_Auto on the shortcut shift"). The authors' networks had none that
    move (GroupNorm in AutoFedGP's MNIST_CNN, frozen BatchNorm in DomainBed's ResNet), so this is
    what their estimators computed.
    """
    if batch_updates is None or batch_updates.shape[0] < 2:
        raise UserError("auto-weighting (FedDA_Auto/FedGP_Auto) needs at least two target batches per "
                        "round: raise target_train.steps/epochs or labeled, or lower target_train.batch_size")
    g = aligned_target_updates(theta0, batch_updates, spec)
    keys = estimator_keys(theta0)
    columns = torch.cat([torch.full((theta0[k].numel(),), k in set(keys)) for k in update_keys(theta0)])
    flat = [agg.source_step_update(flatten_state(d, keys)[0], max(int(b), 1))
            for d, b in zip(deltas, spec["n_batches"])]
    return agg.auto_betas(g[:, columns], torch.stack(flat), rule=spec["rule"])


def estimator_keys(theta0: StateDict) -> list[str]:
    """The entries the auto-β estimators run over: every non-0-dim entry but BN running statistics."""
    return [k for k in update_keys(theta0) if not k.endswith(UNSCALED_SUFFIXES)]


#: ``auto_alignment`` → the factor the target's per-batch updates are multiplied by (lr_S, lr_T)
ALIGNMENTS = {
    "lr_s_over_lr_t": lambda lr_s, lr_t: lr_s / lr_t,
    "lr_t_over_lr_s": lambda lr_s, lr_t: lr_t / lr_s,
}


def aligned_target_updates(theta0: StateDict, batch_updates: torch.Tensor, spec: dict) -> torch.Tensor:
    """The target's per-batch updates brought to the sources' step size: × lr_S/lr_T.

    A step moves a weight by about its learning rate (Adam: ≈ lr per coordinate; SGD: lr·grad),
    so a target step at lr_T becomes comparable with a source step ``s = Δ_i/#batches`` at lr_S
    when multiplied by lr_S/lr_T (measured in tests/pipeline/test_combine.py). The authors'
    DomainBed script multiplies by lr_T/lr_S (``grads_all_epochs * args.lr_ratio``), which
    shrinks the target's steps a second time instead of aligning them: a deliberate departure
    (README, "Methods"); ``spec["alignment"] = "lr_t_over_lr_s"`` (config ``auto_alignment``)
    replays theirs. FedGP_Auto's β does not depend on this factor (σ² and τ²d² scale alike);
    FedDA_Auto's does (d² compares g_j with s). Columns of BN running statistics are left
    unscaled (their change does not depend on the learning rate; the estimators leave them out).
    """
    alignment = spec.get("alignment") or "lr_s_over_lr_t"
    if alignment not in ALIGNMENTS:
        raise ValueError(f"unknown auto-weighting alignment {alignment!r}; known: {', '.join(ALIGNMENTS)}")
    factor = ALIGNMENTS[alignment](float(spec["lr_source"]), float(spec["lr_target"]))
    scale = torch.cat([
        torch.full((theta0[k].numel(),), 1.0 if k.endswith(UNSCALED_SUFFIXES) else factor)
        for k in update_keys(theta0)
    ])
    if scale.numel() != batch_updates.shape[1]:
        raise ValueError(f"target batch updates have {batch_updates.shape[1]} values per step, the model "
                         f"{scale.numel()}")
    return batch_updates.float() * scale
