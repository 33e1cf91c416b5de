"""Gradient projection and its federated forms: GP, FedGP, FedDA (target-combine rules).

Papers (``../shared/papers``): GP = weakly-supervised-fda-auxinfo-gp (Eq. 4-9, App. A.2);
FedDA/FedGP = fedgp-auto-weighting-iclr (Def. 4.1, 4.3; App. C.9). Every rule here is
``θ0 + a_T·Δ_T + Σ_i w_i·g_i·Δ_i`` per entry, computed by one kernel (:class:`_Entry`,
:func:`_combine`) in two passes over each entry; :func:`magnitude_scales` aligns a source's
update with the target's (GP App. A.2 Eq. 8). The β_i of the ``_Auto`` methods come from
:mod:`fedcxr.pipeline.aggregate.auto_weighting`.

0-dim entries (``num_batches_tracked``) and integer entries of any shape never take part in
cosines and keep θ0; BN running statistics are entries like any other.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import torch

from fedcxr.pipeline.aggregate.checks import _positive, _unit_interval
from fedcxr.pipeline.state import StateDict, _compute_dtype, _is_updatable, _require_same_structure

__all__ = ["COS_EPS", "fedda", "fedgp", "gp", "magnitude_scales", "projection_cosines"]

#: Norms are clamped at this value in cosines, so a zero update has cosine 0 (never NaN).
COS_EPS = 1e-8


def magnitude_scales(n_sources, n_target, bs_source, bs_target, lr_source, lr_target, epochs_source=1,
                     epochs_target=1, steps_source=None, steps_target=None) -> list[float]:
    """``s_i = (lr_T/lr_S)·(E_T/E_S)·((n_T/bs_T)/(n_i/bs_S))·(n_i/Σn)`` (DESIGN §5; GP App. A.2 Eq. 8).

    Aligns a source update (n_i/bs_S steps at lr_S for E_S epochs) with the target's
    (n_T/bs_T steps at lr_T for E_T epochs) and weights it by n_i/Σn. ``E·n/bs`` is the number
    of optimiser steps an update took; when the real counts are known (``steps_source[i]``,
    ``steps_target``: a ``steps:`` budget, a last partial batch, skipped batches) they replace
    it: ``s_i = (lr_T/lr_S)·(steps_T/steps_i)·(n_i/Σn)`` — the same number for whole epochs
    of full batches. Without step counts n_i cancels and every source gets the same scale;
    computed literally anyway so the code reads like the formula.
    """
    n = [_positive(f"n_sources[{i}]", v) for i, v in enumerate(n_sources)]
    total = sum(n)
    lr_ratio = _positive("lr_target", lr_target) / _positive("lr_source", lr_source)
    if steps_source is not None and steps_target is not None:
        if len(steps_source) != len(n):
            raise ValueError(f"{len(n)} sources but {len(steps_source)} step counts")
        t_steps = _positive("steps_target", steps_target)
        return [lr_ratio * (t_steps / _positive(f"steps_source[{i}]", k)) * (n_i / total)
                for i, (k, n_i) in enumerate(zip(steps_source, n))]
    ratio = lr_ratio * (_positive("epochs_target", epochs_target) / _positive("epochs_source", epochs_source))
    target_steps = _positive("n_target", n_target) / _positive("bs_target", bs_target)
    bs_s = _positive("bs_source", bs_source)
    return [ratio * (target_steps / (n_i / bs_s)) * (n_i / total) for n_i in n]


def _check_inputs(theta0, target, sources, n: int, who: str) -> None:
    if not sources:
        raise ValueError(f"{who}: no source updates")
    if len(sources) != n:
        raise ValueError(f"{who}: {len(sources)} sources but {n} per-source values")
    _require_same_structure(target, theta0, f"{who}: target")
    for i, source in enumerate(sources):
        _require_same_structure(source, theta0, f"{who}: source {i}")


#: Entries up to this many values are processed whole, their N sources stacked (N, n).
_SMALL = 1 << 12
#: Larger entries are processed in blocks of this many values (1 MB in float32), so that the
#: blocks of θ0, Δ_T and the result stay in cache while the sources stream past.
_BLOCK = 1 << 18


class _Entry:
    """One updatable entry of θ0, the target and the sources, flattened (the GP-family kernel).

    Two passes, because every cosine needs the whole entry before any source can be added:

    1. :meth:`sums` — ``‖Δ_T‖²``, ``⟨Δ_T, Δ_i⟩`` and ``‖Δ_i‖²``, Δ_T and Δ_i formed one
       block at a time in a 2-row scratch; block sums are added in float64.
    2. :meth:`combine` — ``θ0 + a_T·Δ_T + Σ_i w_i·Δ_i``, block by block: ``lerp(θ0, T, a_T)``
       then ``+ w_i·S_i`` for each source with w_i ≠ 0 and ``− (Σw)·θ0``, so each source is
       read once more and no Δ_i is formed (rounding stays at float32 resolution of
       ``(1 + 2Σw)·|θ0|``, the same order as adding w_i·Δ_i).

    Cost: pass 1 needs Δ_i materialised (plain torch has no fused "subtract and reduce"), so
    a source costs about three streaming passes (sub, dots, add) against one for a copy.

    Memory: the result plus a (2, block) scratch; no full-size temporary per source, so a
    rule's peak is the inputs plus one model (benchmarks/bench_aggregate.py).
    """

    def __init__(self, key: str, theta0, target, sources, scratch: dict):
        t0 = theta0[key].detach()
        self.shape, self.dtype = t0.shape, t0.dtype
        self.cd = _compute_dtype(t0.dtype)
        self.base = t0.reshape(-1).to(self.cd)  # copies only for float16/bfloat16 entries
        self.target = target[key].detach().reshape(-1).to(self.cd)
        self.sources = [s[key].detach().reshape(-1) for s in sources]
        self.numel = self.base.numel()
        self.small = self.numel <= _SMALL
        if not self.small:
            slot = (self.cd, self.base.device)
            if slot not in scratch:
                scratch[slot] = torch.empty(2, _BLOCK, dtype=self.cd, device=self.base.device)
            self.scratch = scratch[slot]

    def _stacked(self) -> torch.Tensor:
        """Small entries: the sources stacked, (N, n), in the compute dtype."""
        return torch.stack([s.to(self.cd) for s in self.sources])

    def sums(self) -> tuple[float, list[float], list[float]]:
        """(‖Δ_T‖², [⟨Δ_T, Δ_i⟩], [‖Δ_i‖²]), summed in float64."""
        f64 = torch.float64
        if self.small:
            d = self._stacked().sub_(self.base)
            d_t = self.target - self.base
            return float(torch.dot(d_t, d_t)), (d @ d_t).to(f64).tolist(), torch.linalg.vecdot(d, d).to(f64).tolist()
        tt, parts = [], []
        for a in range(0, self.numel, _BLOCK):
            b = min(a + _BLOCK, self.numel)
            base, d_t, d_i = self.base[a:b], self.scratch[0, : b - a], self.scratch[1, : b - a]
            torch.sub(self.target[a:b], base, out=d_t)
            tt.append(torch.dot(d_t, d_t))
            for source in self.sources:
                torch.sub(source[a:b], base, out=d_i)
                parts += [torch.dot(d_t, d_i), torch.dot(d_i, d_i)]  # (measured faster than one mv)
        per_source = torch.stack(parts).to(f64).view(len(tt), len(self.sources), 2).sum(0)
        return float(torch.stack(tt).to(f64).sum()), per_source[:, 0].tolist(), per_source[:, 1].tolist()

    def combine(self, target_coef: float, weights: Sequence[float]) -> torch.Tensor:
        """``θ0 + target_coef·Δ_T + Σ_i weights[i]·Δ_i`` in the entry's shape and dtype."""
        used = [(s, float(w)) for s, w in zip(self.sources, weights) if w != 0]
        total = sum(w for _, w in used)
        if self.small:
            result = torch.lerp(self.base, self.target, target_coef)
            if used:
                stacked = torch.stack([s.to(self.cd) for s, _ in used])
                w = torch.tensor([w for _, w in used], dtype=self.cd, device=result.device)
                result.addmv_(stacked.T, w).sub_(self.base, alpha=total)
        else:
            result = torch.empty(self.numel, dtype=self.cd, device=self.base.device)
            for a in range(0, self.numel, _BLOCK):
                b = min(a + _BLOCK, self.numel)
                block = torch.lerp(self.base[a:b], self.target[a:b], target_coef, out=result[a:b])
                for source, w in used:
                    block.add_(source[a:b], alpha=w)
                if used:
                    block.sub_(self.base[a:b], alpha=total)
        return result.reshape(self.shape).to(self.dtype)


def _cosines(tt: float, dots: Sequence[float], sq: Sequence[float]) -> list[float]:
    """cos(Δ_T, Δ_i) from the pass-1 sums, each norm clamped at :data:`COS_EPS` (GP Eq. 4)."""
    norm_t = max(math.sqrt(tt), COS_EPS)
    return [d / (norm_t * max(math.sqrt(q), COS_EPS)) for d, q in zip(dots, sq)]


def _combine(
    theta0: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    sources: Sequence[Mapping[str, torch.Tensor]],
    *,
    target_coef: float,
    source_coefs: Sequence[float],
    project: bool,
) -> StateDict:
    """``θ0 + a_T·Δ_T + Σ_i w_i·g_i·Δ_i`` per entry, the kernel of GP, FedGP and FedDA.

    With ``project``: ``g_i = cos(Δ_T, Δ_i)`` if it is > 0 (strict), else source i is dropped
    for this entry (GP Eq. 4-5). Without: ``g_i = 1``. Non-updatable entries (0-dim,
    integer) keep θ0 (copied). See :class:`_Entry` for the passes and the memory bound.
    """
    out: StateDict = {}
    scratch: dict = {}
    for key, t0 in theta0.items():
        if not _is_updatable(t0):
            out[key] = t0.detach().clone()
            continue
        entry = _Entry(key, theta0, target, sources, scratch)
        weights = list(source_coefs)
        if project:
            cosines = _cosines(*entry.sums())
            # Strict c > 0 (GP Eq. 5); a NaN cosine (corrupt update) is dropped too.
            weights = [w * c if c > 0 else 0.0 for w, c in zip(weights, cosines)]
        out[key] = entry.combine(target_coef, weights)
    return out


def projection_cosines(
    theta0: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    sources: Sequence[Mapping[str, torch.Tensor]],
) -> dict[str, list[float]]:
    """Per-entry ``cos(Δ_T, Δ_i)`` exactly as :func:`gp` computes them: ``{key: [c_1 .. c_N]}``.

    For diagnostics (which sources GP keeps, per layer: those with ``c_i > 0``). Only
    updatable entries (floating, non-0-dim) appear. Note that the strict ``c_i > 0`` and a
    non-strict filter give the same model (a source with ``c_i = 0`` adds ``0·Δ_i``); the
    difference shows only here, in which sources count as kept.
    """
    _check_inputs(theta0, target, sources, len(sources), "projection_cosines")
    scratch: dict = {}
    return {
        key: _cosines(*_Entry(key, theta0, target, sources, scratch).sums())
        for key, t0 in theta0.items()
        if _is_updatable(t0)
    }


def gp(
    theta0: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    sources: Sequence[Mapping[str, torch.Tensor]],
    *,
    n_sources: Sequence[float],
    n_target: float,
    bs_source: float,
    bs_target: float,
    lr_source: float,
    lr_target: float,
    epochs_source: float = 1,
    epochs_target: float = 1,
    beta: float = 0.5,
    steps_source: Optional[Sequence[float]] = None,
    steps_target: Optional[float] = None,
) -> StateDict:
    """Gradient projection on the target (AuxInfo+GP paper, Eq. 4-9 and App. A.2; DESIGN §5).

    Per entry k, with Δ_T = target − θ0 and Δ_i = source_i − θ0:
    ``c_i = cos(Δ_T, Δ_i)`` (norms clamped at 1e-8, so a zero update gives 0), source i kept
    only where ``c_i > 0`` (strict: an orthogonal update is dropped), and

        θ = θ0 + β·Σ_{c_i>0} s_i·c_i·Δ_i + (1−β)·Δ_T,

    ``s_i`` as in :func:`magnitude_scales` (from the real optimiser step counts when
    ``steps_source``/``steps_target`` are given). β weights the SOURCES (the paper's text and code;
    its Eq. 7/9 print it the other way round): β=0 gives the target's own fine-tuned model,
    β=1 only the projected sources. BN running statistics are entries like any other and take
    part in cosines; 0-dim and integer entries keep θ0.
    """
    _check_inputs(theta0, target, sources, len(n_sources), "gp")
    beta = _unit_interval("beta", beta)
    scales = magnitude_scales(n_sources, n_target, bs_source, bs_target, lr_source, lr_target, epochs_source,
                               epochs_target, steps_source, steps_target)
    return _combine(theta0, target, sources, target_coef=1.0 - beta, source_coefs=[beta * s for s in scales], project=True)


def fedgp(
    theta0: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    sources: Sequence[Mapping[str, torch.Tensor]],
    *,
    betas: Sequence[float],
    n_sources: Sequence[float],
    n_target: float,
    bs_source: float,
    bs_target: float,
    lr_source: float,
    lr_target: float,
    epochs_source: float = 1,
    epochs_target: float = 1,
    steps_source: Optional[Sequence[float]] = None,
    steps_target: Optional[float] = None,
) -> StateDict:
    """FedGP with per-source β_i (FedGP paper Def. 4.3 and App. C.9; DESIGN §5).

        θ = θ0 + Σ_{c_i>0} β_i·s_i·c_i·Δ_i + Σ_i (1−β_i)·(n_i/Σn)·Δ_T

    with ``c_i`` and ``s_i`` exactly as in :func:`gp`. The target term is added once per
    source, weighted by n_i/Σn, so with every β_i = 0 the result is θ0 + Δ_T; with equal β_i
    = β it equals :func:`gp`. ``betas`` from :func:`auto_betas` (FedGP_Auto) or fixed.
    """
    _check_inputs(theta0, target, sources, len(n_sources), "fedgp")
    betas = _betas(betas, len(sources), "fedgp")
    scales = magnitude_scales(n_sources, n_target, bs_source, bs_target, lr_source, lr_target, epochs_source,
                               epochs_target, steps_source, steps_target)
    total = sum(float(n) for n in n_sources)
    # summed, then divided once: with every β_i = 0 the coefficient is exactly 1.0, so the
    # result is the target's own model bit for bit (lerp with weight 1 returns its end)
    target_coef = sum((1.0 - b) * float(n) for b, n in zip(betas, n_sources)) / total
    return _combine(theta0, target, sources, target_coef=target_coef, source_coefs=[b * s for b, s in zip(betas, scales)], project=True)


def fedda(
    theta0: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    sources: Sequence[Mapping[str, torch.Tensor]],
    *,
    betas: Sequence[float],
    n_sources: Sequence[float],
) -> StateDict:
    """FedDA: convex combination without projection (FedGP paper Def. 4.1; DESIGN §5).

        θ = θ0 + Σ_i (n_i/Σn)·(β_i·Δ_i + (1−β_i)·Δ_T)

    No cosine filter and no magnitude scaling. ``n_sources`` may contain zeros (that source
    gets no weight) but must have a positive sum. 0-dim and integer entries keep θ0.
    """
    _check_inputs(theta0, target, sources, len(n_sources), "fedda")
    betas = _betas(betas, len(sources), "fedda")
    n = [float(v) for v in n_sources]
    if any(not math.isfinite(v) or v < 0 for v in n) or sum(n) <= 0:
        raise ValueError(f"fedda: n_sources must be >= 0 with a positive sum, got {n}")
    total = sum(n)
    target_coef = sum((1.0 - b) * v for b, v in zip(betas, n)) / total  # exactly 1.0 when every β_i = 0
    return _combine(theta0, target, sources, target_coef=target_coef, source_coefs=[b * v / total for b, v in zip(betas, n)], project=False)


def _betas(betas: Sequence[float], n: int, who: str) -> list[float]:
    betas = [float(b) for b in betas]
    if len(betas) != n:
        raise ValueError(f"{who}: {n} sources but {len(betas)} betas")
    return [_unit_interval(f"{who}: betas[{i}]", b) for i, b in enumerate(betas)]
