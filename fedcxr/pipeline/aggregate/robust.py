"""Robust rules: the config's ``aggregation:`` besides ``mean`` (Flower's ``aggregate_median`` /
``aggregate_trimmed_avg`` / ``aggregate_krum``).

:func:`coordinate_median` and :func:`trimmed_mean` (Yin et al. 2018), :func:`krum` and
:func:`multi_krum` (Blanchard et al. 2017), :func:`norm_clipped_mean` (Sun et al. 2019). They take
the sites' states as they are (no sample weights, except the clipped mean) and treat integer,
0-dim and BatchNorm entries like the rest: BN running statistics are per-coordinate values like
weights; an integer entry (``num_batches_tracked``) is computed in float64 and rounded back to its
dtype.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional, Sequence

import torch

from fedcxr.pipeline.state import StateDict, _compute_dtype, _require_same_structure

__all__ = [
    "ROBUST_RULES", "clip_factors", "coordinate_median", "krum", "krum_scores", "krum_select", "multi_krum",
    "norm_clipped_mean", "trimmed_mean", "update_norms",
]

#: The rules of the config's ``aggregation.rule`` besides ``mean`` (FedAvg / FedBN).
ROBUST_RULES = ("median", "trimmed_mean", "krum", "multi_krum", "clip")


def _stack_entry(states: Sequence[Mapping[str, torch.Tensor]], key: str) -> tuple[torch.Tensor, torch.dtype]:
    """``(n, *shape)`` of entry ``key`` over the states, in its compute dtype (float64 for integers)."""
    dtype = states[0][key].dtype
    cd = _compute_dtype(dtype) if dtype.is_floating_point else torch.float64
    return torch.stack([s[key].detach().to(cd) for s in states]), dtype


def _back(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A computed entry back in its dtype; integers rounded to nearest (ties to even)."""
    return value.to(dtype) if dtype.is_floating_point else value.round().to(dtype)


def _same_structure(states: Sequence[Mapping[str, torch.Tensor]], who: str) -> None:
    if not states:
        raise ValueError(f"{who}: no states")
    for i, state in enumerate(states[1:], start=2):
        _require_same_structure(state, states[0], f"{who}: state #{i}")


def coordinate_median(states: Sequence[Mapping[str, torch.Tensor]]) -> StateDict:
    """Coordinate-wise median (Yin et al. 2018, "Byzantine-robust distributed learning: towards
    optimal statistical rates", ICML, Def. 1 ``med``; Flower's ``aggregate_median``).

    Per coordinate of every entry, the median of the n sites' values; for an even n the mean of
    the two middle values (as ``numpy.median``; ``torch.median`` would return the lower one).
    With an odd n every coordinate is one site's own value, bit for bit. Sample counts are not
    used: a site's weight cannot be inflated by claiming more rows. Breakdown point: fewer than
    half of the sites may be arbitrary.
    """
    _same_structure(states, "coordinate_median")
    n = len(states)
    out: StateDict = {}
    for key in states[0]:
        stacked, dtype = _stack_entry(states, key)
        ordered = stacked.sort(dim=0).values
        low, high = ordered[(n - 1) // 2], ordered[n // 2]
        out[key] = _back(low if n % 2 else (low + high) / 2, dtype)
    return out


def trimmed_mean(states: Sequence[Mapping[str, torch.Tensor]], trim: float) -> StateDict:
    """Coordinate-wise β-trimmed mean (Yin et al. 2018, Def. 2 ``trmean_β``; Flower's
    ``aggregate_trimmed_avg``).

    Per coordinate: sort the n values, drop the ``b = int(β·n)`` smallest and the ``b``
    largest (scipy's ``trim_mean`` rounding, as Flower), average the ``n − 2b`` left.
    ``trim`` = β in [0, 0.5); β = 0 is the plain unweighted mean. Sample counts are not used.
    Up to ``b`` arbitrary sites per coordinate are cut off.
    """
    _same_structure(states, "trimmed_mean")
    trim = float(trim)
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trimmed_mean: trim must lie in [0, 0.5), got {trim}")
    n = len(states)
    cut = int(trim * n)
    out: StateDict = {}
    for key in states[0]:
        stacked, dtype = _stack_entry(states, key)
        kept = stacked.sort(dim=0).values[cut : n - cut]
        out[key] = _back(kept.mean(dim=0), dtype)
    return out


def _float_keys(state: Mapping[str, torch.Tensor], exclude: Iterable[str] = ()) -> list[str]:
    skip = set(exclude)
    return [k for k, v in state.items() if v.is_floating_point() and k not in skip]


def _pairwise_sq_distances(states: Sequence[Mapping[str, torch.Tensor]]) -> torch.Tensor:
    """``D[i, j] = ‖x_i − x_j‖²`` over every floating entry (float64; integers left out)."""
    n = len(states)
    dist = torch.zeros(n, n, dtype=torch.float64)
    for key in _float_keys(states[0]):
        flat = [s[key].detach().reshape(-1).to(torch.float64) for s in states]
        for i in range(n):
            for j in range(i + 1, n):
                d = torch.sub(flat[i], flat[j]).square().sum()
                dist[i, j] += d
                dist[j, i] += d
    return dist


def _krum_check(n: int, byzantine: int, who: str) -> int:
    f = int(byzantine)
    if f != byzantine or f < 0:
        raise ValueError(f"{who}: byzantine (f) must be a non-negative integer, got {byzantine!r}")
    if n < 2 * f + 3:
        raise ValueError(f"{who}: Krum with f={f} needs at least 2f+3 = {2 * f + 3} states, got {n}")
    return f


def krum_scores(states: Sequence[Mapping[str, torch.Tensor]], byzantine: int) -> list[float]:
    """Krum scores (Blanchard et al. 2017, "Machine learning with adversaries: Byzantine tolerant
    gradient descent", NeurIPS, §4): ``s(i) = Σ_{j ∈ N_i} ‖V_i − V_j‖²`` over the ``n − f − 2``
    states closest to ``V_i`` (j ≠ i). Needs ``n ≥ 2f + 3`` (the paper's ``2f + 2 < n``).

    Distances are over every floating entry (BN statistics included, integers left out), in
    float64. Models or updates give the same scores (θ0 cancels).
    """
    _same_structure(states, "krum_scores")
    n = len(states)
    f = _krum_check(n, byzantine, "krum_scores")
    dist = _pairwise_sq_distances(states)
    closest = n - f - 2
    scores = []
    for i in range(n):
        others = torch.cat([dist[i, :i], dist[i, i + 1 :]]).sort().values
        scores.append(float(others[:closest].sum()))
    return scores


def krum_select(states: Sequence[Mapping[str, torch.Tensor]], byzantine: int, select: int = 1) -> list[int]:
    """Indices of the ``select`` states with the lowest Krum scores (ties: the lower index)."""
    scores = krum_scores(states, byzantine)
    m = int(select)
    if m != select or not 1 <= m <= len(states):
        raise ValueError(f"krum_select: select (m) must be an integer in 1..{len(states)}, got {select!r}")
    return sorted(range(len(states)), key=lambda i: (scores[i], i))[:m]


def krum(states: Sequence[Mapping[str, torch.Tensor]], byzantine: int) -> StateDict:
    """Krum (Blanchard et al. 2017, §4): the one state with the lowest :func:`krum_scores`, copied.

    Tolerates ``f`` Byzantine sites among ``n ≥ 2f + 3``. Sample counts are not used.
    """
    chosen = states[krum_select(states, byzantine, 1)[0]]
    return {k: v.detach().clone() for k, v in chosen.items()}


def multi_krum(states: Sequence[Mapping[str, torch.Tensor]], byzantine: int, select: Optional[int] = None) -> StateDict:
    """Multi-Krum (Blanchard et al. 2017, §5): the unweighted mean of the ``m`` states with the
    lowest Krum scores (scores computed once, as the paper and Flower's ``aggregate_krum``).

    ``select`` = m, default ``n − f``; m = 1 is :func:`krum`. Unlike Flower, which weights the
    selected states by their sample counts, the mean is unweighted as in the paper (a hostile
    site's claimed count then cannot matter). Integer entries: the mean rounded.
    """
    n = len(states)
    m = n - int(byzantine) if select is None else select
    chosen = [states[i] for i in krum_select(states, byzantine, m)]
    return trimmed_mean(chosen, 0.0)


def update_norms(theta0: Mapping[str, torch.Tensor], states: Sequence[Mapping[str, torch.Tensor]],
                 exclude: Iterable[str] = ()) -> list[float]:
    """``‖θ_i − θ0‖`` over every floating entry not in ``exclude`` (float64 sums)."""
    keys = _float_keys(theta0, exclude)
    norms = []
    for i, state in enumerate(states):
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"update_norms: state #{i + 1} lacks entries {missing[:5]}")
        total = 0.0
        for key in keys:
            d = torch.sub(state[key].detach().to(torch.float64), theta0[key].detach().to(torch.float64))
            total += float(d.square().sum())
        norms.append(math.sqrt(total))
    return norms


def clip_factors(norms: Sequence[float], clip_norm: Optional[float] = None) -> tuple[float, list[float]]:
    """``(M, [min(1, M/‖Δ_i‖)])`` — the norm bound and each update's scale (1 for a zero update).

    ``clip_norm`` = M; ``None``: the median of ``norms`` (the mean of the middle two for an even
    count), a bound that adapts to the round's honest update size.
    """
    norms = [float(v) for v in norms]
    if not norms:
        raise ValueError("clip_factors: no update norms")
    if any(not math.isfinite(v) or v < 0 for v in norms):
        raise ValueError(f"clip_factors: norms must be finite and >= 0, got {norms}")
    if clip_norm is None:
        ordered = sorted(norms)
        half = len(ordered) // 2
        bound = ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
    else:
        bound = float(clip_norm)
        if not math.isfinite(bound) or bound <= 0:
            raise ValueError(f"clip_factors: clip_norm must be a positive number, got {clip_norm!r}")
    return bound, [1.0 if v <= bound else bound / v for v in norms]


def norm_clipped_mean(theta0: Mapping[str, torch.Tensor], states: Sequence[Mapping[str, torch.Tensor]],
                      weights: Sequence[float], clip_norm: Optional[float] = None) -> StateDict:
    """Norm-bounded FedAvg (Sun et al. 2019, "Can you really backdoor federated learning?", §3
    "norm thresholding": each update is scaled to ``Δ_i / max(1, ‖Δ_i‖/M)`` before averaging).

        θ = θ0 + Σ_i w_i·min(1, M/‖Δ_i‖)·Δ_i / Σ_i w_i,   Δ_i = θ_i − θ0

    ``weights`` as :func:`fedavg` (sample counts or equal weights); ``M`` = ``clip_norm`` or,
    when ``None``, the median of the round's ``‖Δ_i‖`` (:func:`clip_factors`). ‖Δ_i‖ is taken
    over every floating entry (BN statistics included) in float64; integer entries are
    averaged as :func:`fedavg` averages them. Centred at θ0, the round's global model.
    """
    _same_structure(states, "norm_clipped_mean")
    _require_same_structure(states[0], theta0, "norm_clipped_mean: theta0")
    weights = [float(w) for w in weights]
    if len(weights) != len(states):
        raise ValueError(f"norm_clipped_mean: {len(states)} states but {len(weights)} weights")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"norm_clipped_mean: weights must be >= 0 with a positive sum, got {weights}")
    _, factors = clip_factors(update_norms(theta0, states), clip_norm)
    total = sum(weights)
    coefs = [w * c / total for w, c in zip(weights, factors)]
    out: StateDict = {}
    for key, t0 in theta0.items():
        if not t0.is_floating_point():
            stacked, dtype = _stack_entry(states, key)
            w = torch.tensor(weights, dtype=torch.float64).view(-1, *[1] * (stacked.dim() - 1))
            out[key] = _back((stacked * w).sum(dim=0) / total, dtype)
            continue
        cd = _compute_dtype(t0.dtype)
        base = t0.detach().to(cd)
        result = base.clone()
        for state, coef in zip(states, coefs):
            if coef:
                result.add_(torch.sub(state[key].detach().to(cd), base), alpha=coef)
        out[key] = result.to(t0.dtype)
    return out
