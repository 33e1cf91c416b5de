"""Aggregation rules: pure functions on state dicts (DESIGN §5, interfaces §10).

Every rule here takes ``StateDict`` s (``dict[str, Tensor]``) plus metadata (sample counts,
class sets, learning rates) and returns a new ``StateDict``. Nothing is trained, sent or logged
here: the in-process federation and NVIDIA FLARE call these same functions, so a rule tested
once serves both transports (STYLE: Flower's ``strategy/aggregate.py``).

Conventions shared by all rules:

* **Inputs are never mutated.** Arithmetic rules return fresh tensors; the dict helpers
  (:mod:`fedcxr.pipeline.state`) are shallow and say so.
* **Per state-dict entry.** Weights, biases and each BatchNorm tensor (``weight``, ``bias``,
  ``running_mean``, ``running_var``) are separate entries; cosines are taken per entry. Every
  entry is processed with whole-tensor ops (no Python loop over elements); loops run over
  entries and sources only.
* **Dtypes.** Arithmetic runs in float32 (float64 when the input is float64) and the result
  is cast back to the entry's original dtype.
* **Special entries.** 0-dim entries (``num_batches_tracked``) never take part in cosines and
  keep θ0 in :func:`gp`, :func:`fedgp` and :func:`fedda`; so do integer entries of any shape
  (none exist in our models; an integer counter has no meaningful "update"). FedAvg averages
  every entry: integer ones as a weighted mean rounded back to their dtype.

Papers (``../shared/papers``): GP = weakly-supervised-fda-auxinfo-gp (Eq. 4-9, App. A.2);
FedDA/FedGP and auto-weighting = fedgp-auto-weighting-iclr (Def. 4.1, 4.3; Eq. 1-3; App. A.5,
C.4, C.9); surgical aggregation (Eq. 1-3, Alg. 1); FACT (Eq. 1).

Robust rules (the config's ``aggregation:``, Flower's ``aggregate_median`` /
``aggregate_trimmed_avg`` / ``aggregate_krum``): :func:`coordinate_median` and
:func:`trimmed_mean` (Yin et al. 2018), :func:`krum` and :func:`multi_krum` (Blanchard et al.
2017), :func:`norm_clipped_mean` (Sun et al. 2019). They take the sites' states as they are
(no sample weights, except the clipped mean) and treat integer, 0-dim and BatchNorm entries
like the rest: BN running statistics are per-coordinate values like weights; an integer entry
(``num_batches_tracked``) is computed in float64 and rounded back to its dtype.

The reviewers' baselines
(not in ``../shared/papers``): SCAFFOLD = Karimireddy et al. 2020 (ICML), Algorithm 1; FedOpt
(FedAdagrad, FedAdam, FedYogi) = Reddi et al. 2021 (ICLR), Algorithm 2. FedProx (Li et al. 2020,
MLSys) changes only the local loss (:func:`fedcxr.pipeline.losses.proximal_term`); its server is
:func:`fedavg`.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional, Sequence, Union

import torch

from fedcxr.pipeline.state import (
    StateDict,
    _compute_dtype,
    _is_updatable,
    _require_same_structure,
    _shape,
    _structure_problem,
)

#: Norms are clamped at this value in cosines, so a zero update has cosine 0 (never NaN).
COS_EPS = 1e-8

__all__ = [
    "StreamingAverage",
    "fedavg",
    "fedavg_streaming",
    "fedbn",
    "surgical_heads",
    "gp",
    "fedgp",
    "fedda",
    "projection_cosines",
    "magnitude_scales",
    "auto_betas",
    "idd",
    "source_step_update",
    "ROBUST_RULES",
    "coordinate_median",
    "trimmed_mean",
    "krum_scores",
    "krum_select",
    "krum",
    "multi_krum",
    "update_norms",
    "clip_factors",
    "norm_clipped_mean",
    "FEDOPT_RULES",
    "fedopt",
    "scaffold",
    "scaffold_client_control",
]



def source_step_update(update: Union[torch.Tensor, Mapping[str, torch.Tensor]], n_batches: int) -> Union[torch.Tensor, StateDict]:
    """A source's mean per-step update ``s = Δ_i / #batches`` (auto-weighting, App. C.4).

    Accepts a flat vector (from :func:`flatten_state`) or a state dict (floating entries are
    divided; integer ones are returned unchanged, as copies). The target's per-batch updates
    and ``s`` must be in the same units before :func:`auto_betas`.
    """
    if int(n_batches) != n_batches or n_batches < 1:
        raise ValueError(f"source_step_update: n_batches must be a positive integer, got {n_batches!r}")
    if isinstance(update, torch.Tensor):
        return update / n_batches
    return {
        k: (v / n_batches if v.is_floating_point() else v.clone()) for k, v in update.items()
    }


# --------------------------------------------------------------------------- FedAvg / FedBN


class StreamingAverage:
    """Sample-weighted mean of state dicts, fed one reply at a time (FedAvg, FedBN).

    Holds one running weighted sum (float32; float64 for float64 and integer entries) and
    keeps no reference to the replies, so memory is one model plus the reply being added
    (plus the output model in :meth:`result`), whatever the number of sites: the federation
    adds each reply as it arrives and drops it.

    ``exclude``: entries left out of the average and of the result (FedBN keeps BN local);
    each must exist in the first state added.
    """

    def __init__(self, exclude: Iterable[str] = ()):
        self._exclude = frozenset(exclude)
        self._sum: Optional[StateDict] = None
        self._dtypes: dict[str, torch.dtype] = {}
        self._reference: StateDict = {}
        self.total_weight = 0.0
        self.count = 0

    def add(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        """Add ``weight · state`` (weight: the site's sample count, or 1 for unweighted)."""
        weight = float(weight)
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"StreamingAverage.add: weight must be finite and >= 0, got {weight}")
        if self._sum is None:
            self._start(state, weight)
        else:
            body = {k: v for k, v in state.items() if k not in self._exclude}
            problem = _structure_problem(body, self._reference)
            if problem:
                raise ValueError(f"StreamingAverage.add: state #{self.count + 1}: {problem}")
            for key, acc in self._sum.items():
                acc.add_(body[key].detach().to(acc.dtype), alpha=weight)
        self.total_weight += weight
        self.count += 1

    def _start(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        unknown = sorted(self._exclude.difference(state))
        if unknown:
            raise ValueError(f"StreamingAverage: excluded entries {unknown} are not in the state")
        self._sum = {}
        for key, value in state.items():
            if key in self._exclude:
                continue
            value = value.detach()
            acc_dtype = _compute_dtype(value.dtype) if value.is_floating_point() else torch.float64
            self._sum[key] = value.to(acc_dtype) * weight
            self._dtypes[key] = value.dtype
            # Shape/dtype reference for later replies: a storage-less "meta" tensor, so the
            # first reply is not kept alive (memory stays one model).
            self._reference[key] = torch.empty(value.shape, dtype=value.dtype, device="meta")

    def result(self) -> StateDict:
        """The weighted mean, in each entry's original dtype; integers rounded to nearest."""
        if self._sum is None:
            raise ValueError("StreamingAverage.result: no state was added")
        if self.total_weight <= 0:
            raise ValueError("StreamingAverage.result: all weights are zero")
        out: StateDict = {}
        for key, acc in self._sum.items():
            mean = acc / self.total_weight
            dtype = self._dtypes[key]
            out[key] = mean.to(dtype) if dtype.is_floating_point else mean.round().to(dtype)
        return out


def fedavg_streaming(replies: Iterable[tuple[Mapping[str, torch.Tensor], float]], local_keys: Iterable[str] = ()) -> StateDict:
    """FedAvg (or FedBN with ``local_keys``) over an iterator of ``(state, weight)`` pairs.

    Consumes the iterator one pair at a time, so a generator that loads or receives each
    reply keeps memory flat in the number of sites (see :class:`StreamingAverage`).
    """
    avg = StreamingAverage(exclude=local_keys)
    for state, weight in replies:
        avg.add(state, weight)
        del state  # drop the reply before the next one is made
    return avg.result()


def fedavg(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> StateDict:
    """FedAvg: ``Σ_i w_i·θ_i / Σ_i w_i`` per entry, every entry including BN statistics.

    ``weights`` are sample counts (normalised here; pass equal weights for the unweighted
    1/K mean, e.g. the surgical-aggregation backbone, its Eq. 1). Integer entries
    (``num_batches_tracked``) become the weighted mean rounded to the nearest integer (ties to
    even), in their own dtype. Peak memory: two models beyond the inputs (running sum and
    result); callers that receive replies one by one should use :func:`fedavg_streaming`.
    """
    return fedbn(states, weights, ())


def fedbn(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float], local_keys: Iterable[str]) -> StateDict:
    """FedBN: FedAvg of every entry except ``local_keys``, which are left OUT of the result.

    Each site keeps its own BN entries; the caller merges them back per site
    (:func:`fedcxr.pipeline.state.merge_states`). ``local_keys`` must exist in the states.
    """
    states = list(states)
    weights = list(weights)
    if not states:
        raise ValueError("fedavg: no states to average")
    if len(weights) != len(states):
        raise ValueError(f"fedavg: {len(states)} states but {len(weights)} weights")
    return fedavg_streaming(zip(states, weights), local_keys)


# --------------------------------------------------------------------------- surgical aggregation


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


# --------------------------------------------------------------------------- GP / FedGP / FedDA


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value}")
    return value


def _unit_interval(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return value


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


# --------------------------------------------------------------------------- auto-weighting


def auto_betas(target_batch_updates: torch.Tensor, source_updates: torch.Tensor, rule: str = "fedgp") -> dict:
    """Auto-weighted β_i for FedDA/FedGP (FedGP paper §4.2 Eq. 3, App. A.5 and C.4; DESIGN §5).

    Inputs, already flattened (:func:`flatten_state`, the same entries in state-dict order for
    both) and magnitude-aligned by the caller (App. C.4; DESIGN §5): s_i = Δ_i / #batches via
    :func:`source_step_update`, and the g_j rescaled by the learning-rate ratio so that a
    target batch update and a source step are in the same units (steps taken at the same lr).
    :func:`fedcxr.pipeline.combine.auto_estimates` passes the trained parameters only: BN
    running statistics change by batch noise, not by gradient steps, and would swamp σ².

    .. note:: a step moves the weights by about its lr, so that means ``g_j·lr_S/lr_T``
       (:func:`fedcxr.pipeline.combine.aligned_target_updates`); the authors' DomainBed
       script uses lr_T/lr_S. The factor changes FedDA's d² and β; FedGP's β does not depend
       on it.

    * ``target_batch_updates``: ``(B, M)``, the target's B per-batch updates g_j (B ≥ 2);
    * ``source_updates``: ``(N, M)``, one mean per-step update s_i per source.

    Estimators (App. A.5, the unbiased estimators built on Eq. 22-25), each divided by M:

    * ``v = Σ_j ‖g_j − ḡ‖² / (B−1) / M`` (sample variance, summed over coordinates);
      ``σ² = v / B`` (variance of the mean target update);
    * ``d²_i = max(mean_j ‖g_j − s_i‖² / M − v, 0)`` (Eq. 24);
    * ``τ²d²_i = max(mean_j ‖p_j‖² / M − samplevar(p), 0)`` with ``p_j = g_j − ⟨g_j, u_i⟩u_i``,
      ``u_i = s_i/‖s_i‖`` and ``samplevar`` computed like v (Eq. 25);
    * Eq. 3: FedDA ``β_i = σ²/(σ²+d²_i)``, FedGP ``β_i = σ²/(σ²+τ²d²_i)``.

    Guards: an all-zero s_i gets β_i = 0 under both rules (its projection is taken as 0, so
    its τ²d² equals its d²); 0/0 (σ² = 0 and the distance 0) gives β_i = 0: with no evidence
    either way, trust the target.

    Computed in float64 over column blocks of the inputs (a few tens of MB of temporaries),
    through the identity ``mean_j‖g_j − s‖² = ‖ḡ − s‖² + Σ_j‖g_j − ḡ‖²/B`` and its analogue
    for p, which give exactly the formulas above without materialising (B·N, M) differences.

    Returns ``{"sigma2": float, "d2": [N floats], "tau2d2": [N floats], "betas": [N floats]}``.
    """
    if rule not in ("fedgp", "fedda"):
        raise ValueError(f"auto_betas: rule must be 'fedgp' or 'fedda', got {rule!r}")
    g, s = target_batch_updates, source_updates
    if g.dim() != 2 or s.dim() != 2 or g.shape[1] != s.shape[1]:
        raise ValueError(f"auto_betas: expected (B, M) and (N, M) tensors, got {_shape(g)} and {_shape(s)}")
    n_batches, m = int(g.shape[0]), int(g.shape[1])
    if n_batches < 2:
        raise ValueError(f"auto_betas: need at least 2 target batch updates to estimate a variance, got {n_batches}")
    if m == 0 or s.shape[0] == 0:
        raise ValueError(f"auto_betas: empty inputs {_shape(g)} and {_shape(s)}")
    sums = _auto_sums(g.detach(), s.detach())
    v = float(sums["centred"]) / (n_batches - 1) / m
    sigma2 = v / n_batches
    d2, tau2d2, betas = [], [], []
    for i in range(s.shape[0]):
        ss = float(sums["ss"][i])
        d2_i = max(float(sums["dist"][i]) / m - sigma2, 0.0)
        if ss > 0:
            along_mean = float(sums["gs"][i]) ** 2 / ss  # ⟨ḡ, u⟩²
            along_rows = float(sums["proj"][:, i].square().sum()) / ss  # Σ_j ⟨g_j − ḡ, u⟩²
        else:
            along_mean = along_rows = 0.0
        p_bar_sq = max(float(sums["gg"]) - along_mean, 0.0)
        var_p = (float(sums["centred"]) - along_rows) / (n_batches - 1)
        t_i = max((p_bar_sq - var_p / n_batches) / m, 0.0)
        distance = d2_i if rule == "fedda" else t_i
        denominator = sigma2 + distance
        beta = sigma2 / denominator if (ss > 0 and denominator > 0) else 0.0
        d2.append(d2_i)
        tau2d2.append(t_i)
        betas.append(beta)
    return {"sigma2": sigma2, "d2": d2, "tau2d2": tau2d2, "betas": betas}


def _auto_sums(g: torch.Tensor, s: torch.Tensor) -> dict[str, torch.Tensor]:
    """Block-wise float64 sums over coordinates for :func:`auto_betas`.

    centred = Σ_j‖g_j − ḡ‖²; proj[j, i] = ⟨g_j − ḡ, s_i⟩; gg = ‖ḡ‖²; gs[i] = ⟨ḡ, s_i⟩;
    ss[i] = ‖s_i‖²; dist[i] = ‖ḡ − s_i‖².
    """
    b, n, m = g.shape[0], s.shape[0], g.shape[1]
    f64 = dict(dtype=torch.float64, device=g.device)
    sums = {
        "centred": torch.zeros((), **f64), "proj": torch.zeros(b, n, **f64), "gg": torch.zeros((), **f64),
        "gs": torch.zeros(n, **f64), "ss": torch.zeros(n, **f64), "dist": torch.zeros(n, **f64),
    }
    width = max(1024, (2 * 1024 * 1024) // (b + n))  # ≈16 MB of float64 per block
    s = s.to(g.device)
    for start in range(0, m, width):
        gb = g[:, start : start + width].to(torch.float64)
        sb = s[:, start : start + width].to(torch.float64)
        mean = gb.mean(dim=0)
        centred = gb - mean
        sums["centred"] += centred.square().sum()
        sums["proj"] += centred @ sb.T
        sums["gg"] += mean.square().sum()
        sums["gs"] += sb @ mean
        sums["ss"] += sb.square().sum(dim=1)
        sums["dist"] += (sb - mean).square().sum(dim=1)
    return sums


# --------------------------------------------------------------------------- FACT


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


# --------------------------------------------------------------------------- robust rules

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
# --------------------------------------------------------------------------- FedOpt and SCAFFOLD
#
# Both keep server state across rounds (FedOpt's moments m, v; SCAFFOLD's control variate c),
# returned beside the model so the protocol checkpoints it. Both take the clients' mean model
# ``average`` (the protocol's FedAvg of the replies, sample-weighted or 1/K as configured), so
# the pseudo-gradient / server update is ``average − θ``. They act on the entries the caller
# names (the model's trainable parameters, as NVFLARE's FedOpt and SCAFFOLD); every other entry
# — BatchNorm running statistics, ``num_batches_tracked`` — takes ``average`` unchanged (FedAvg):
# a running variance is not a gradient-descent variable, and an adaptive step could make it
# negative.

#: FedOpt server optimisers (Reddi et al. 2021, Algorithm 2).
FEDOPT_RULES = ("adagrad", "adam", "yogi")


def fedopt(
    theta: Mapping[str, torch.Tensor],
    average: Mapping[str, torch.Tensor],
    moments: Optional[Mapping[str, Mapping[str, torch.Tensor]]],
    *,
    rule: str,
    server_lr: float,
    betas: Sequence[float] = (0.9, 0.99),
    tau: float = 1e-3,
    keys: Optional[Iterable[str]] = None,
) -> tuple[StateDict, dict[str, StateDict]]:
    """One FedOpt server step on the pseudo-gradient (Reddi et al. 2021, Algorithm 2).

    Per entry k in ``keys`` (default: every floating, non-0-dim entry), elementwise::

        Δ_t = average − θ                                  (the mean client update)
        m_t = β1·m_{t−1} + (1 − β1)·Δ_t
        v_t = v_{t−1} + Δ_t²                               FedAdagrad (``rule="adagrad"``)
        v_t = v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²)   FedYogi    (``rule="yogi"``)
        v_t = β2·v_{t−1} + (1 − β2)·Δ_t²                   FedAdam    (``rule="adam"``)
        θ_{t+1} = θ + η·m_t / (√v_t + τ)

    ``moments`` is ``{"m": {k: m_{t−1}}, "v": {k: v_{t−1}}}`` from the previous round, or None in
    the first: then m_{−1} = 0 and v_{−1} = τ² (Algorithm 2's initialisation "v_{−1} ≥ τ²", at
    its lower bound). β2 is not used by FedAdagrad. No bias correction: Algorithm 2 has none.

    Entries outside ``keys`` (the caller passes the trainable parameters, so BN running statistics
    and ``num_batches_tracked`` are outside) take ``average`` (FedAvg). Arithmetic in float32
    (float64 for float64 entries); the moments are returned in that dtype.

    Differences from Flower's ``FedAdam``/``FedYogi``/``FedAdagrad`` (``flwr/server/strategy``):
    Flower starts v at 0 (here τ², as Algorithm 2); Flower's FedAdam multiplies η by the Adam
    bias correction √(1−β2^(t+1))/(1−β1^(t+1)) with its 1-based round number t (Algorithm 2 has no
    correction); Flower steps every array it is given, BN running statistics included (here, as
    NVFLARE's ``FedOpt``, those are averaged).

    Returns ``(θ_{t+1}, {"m": m_t, "v": v_t})``; inputs are not mutated.
    """
    if rule not in FEDOPT_RULES:
        raise ValueError(f"fedopt: rule must be one of {FEDOPT_RULES}, got {rule!r}")
    server_lr = _positive("fedopt: server_lr", server_lr)
    tau = _positive("fedopt: tau", tau)
    beta1, beta2 = _decay_pair("fedopt: betas", betas)
    _require_same_structure(average, theta, "fedopt: average")
    keys = _stepped_keys(theta, keys, "fedopt")
    previous_m, previous_v = _previous_moments(theta, moments, keys)
    out: StateDict = {}
    new_m: StateDict = {}
    new_v: StateDict = {}
    for key, x in theta.items():
        if key not in previous_m:
            out[key] = average[key].detach().clone()
            continue
        cd = _compute_dtype(x.dtype)
        x0 = x.detach().to(cd)
        d = average[key].detach().to(cd) - x0
        m = beta1 * previous_m[key].to(cd) + (1.0 - beta1) * d
        v = previous_v[key].to(cd) if previous_v is not None else torch.full_like(x0, tau * tau)
        d2 = d * d
        if rule == "adagrad":
            v = v + d2
        elif rule == "yogi":
            v = v - (1.0 - beta2) * d2 * torch.sign(v - d2)
        else:
            v = beta2 * v + (1.0 - beta2) * d2
        out[key] = (x0 + server_lr * m / (v.sqrt() + tau)).to(x.dtype)
        new_m[key], new_v[key] = m, v
    return out, {"m": new_m, "v": new_v}


def _decay_pair(name: str, betas: Sequence[float]) -> tuple[float, float]:
    values = [float(b) for b in betas]
    if len(values) != 2 or not all(0.0 <= b < 1.0 for b in values):
        raise ValueError(f"{name} must be two numbers in [0, 1), got {list(betas)!r}")
    return values[0], values[1]


def _stepped_keys(theta: Mapping[str, torch.Tensor], keys: Optional[Iterable[str]], who: str) -> list[str]:
    """The entries a server optimiser steps: floating entries of θ, named or all non-0-dim ones."""
    if keys is None:
        return [k for k, v in theta.items() if _is_updatable(v)]
    keys = list(keys)
    unknown = sorted(set(keys).difference(theta))
    if unknown:
        raise ValueError(f"{who}: entries {unknown[:5]} are not in the model")
    integer = sorted(k for k in keys if not theta[k].is_floating_point())
    if integer:
        raise ValueError(f"{who}: integer entries {integer[:5]} cannot take an optimiser step")
    return keys


def _previous_moments(theta, moments, keys) -> tuple[StateDict, Optional[StateDict]]:
    """(m_{t−1}, v_{t−1}) per stepped key; zeros and None (meaning τ²) in the first round."""
    if moments is None:
        return {k: torch.zeros_like(theta[k], dtype=_compute_dtype(theta[k].dtype)) for k in keys}, None
    for part in ("m", "v"):
        if part not in moments:
            raise ValueError(f"fedopt: moments have no {part!r}")
        expected = {k: theta[k] for k in keys}
        problem = _structure_problem(moments[part], expected)
        if problem:
            raise ValueError(f"fedopt: moments[{part!r}] do not match the stepped entries: {problem}")
    return dict(moments["m"]), dict(moments["v"])


def scaffold(
    theta: Mapping[str, torch.Tensor],
    control: Mapping[str, torch.Tensor],
    average: Mapping[str, torch.Tensor],
    control_deltas: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    *,
    server_lr: float = 1.0,
    participation: float = 1.0,
) -> tuple[StateDict, StateDict]:
    """SCAFFOLD's server step (Karimireddy et al. 2020, Algorithm 1, lines 16-17).

    For every entry k of ``control`` (the trainable parameters; c has their shapes)::

        x ← x + η_g·(average − x)              average = Σ_i w̄_i·y_i, the clients' mean model
        c ← c + (|S|/N)·Σ_i w̄_i·Δc_i            Δc_i = c_i⁺ − c_i from :func:`scaffold_client_control`

    with w̄_i = ``weights`` normalised (the same weights that made ``average``), η_g =
    ``server_lr`` and |S|/N = ``participation`` (the share of the N clients that answered).
    Algorithm 1 has w̄_i = 1/|S|: x ← x + (η_g/|S|)·Σ Δy_i and c ← c + (1/N)·Σ Δc_i; with
    sample weights (the house default, as NVFLARE's ``Scaffold``, which weights both by step
    counts) c stays the same weighted mean of the c_i that x follows. With η_g = 1 the model is
    exactly ``average`` (FedAvg); only the local steps differ from FedAvg's.

    Entries outside ``control`` (BN running statistics, ``num_batches_tracked``) take ``average``.
    Returns ``(x, c)``; inputs are not mutated.
    """
    server_lr = _positive("scaffold: server_lr", server_lr)
    participation = float(participation)
    if not 0.0 < participation <= 1.0:
        raise ValueError(f"scaffold: participation must lie in (0, 1], got {participation}")
    _require_same_structure(average, theta, "scaffold: average")
    _stepped_keys(theta, control, "scaffold")
    _require_same_structure(control, {k: theta[k] for k in control}, "scaffold: control")
    if len(control_deltas) != len(weights) or not control_deltas:
        raise ValueError(f"scaffold: {len(control_deltas)} control updates but {len(weights)} weights")
    for i, dc in enumerate(control_deltas):
        _require_same_structure(dc, control, f"scaffold: control update {i}")
    w = [float(v) for v in weights]
    if any(not math.isfinite(v) or v < 0 for v in w) or sum(w) <= 0:
        raise ValueError(f"scaffold: weights must be >= 0 with a positive sum, got {w}")
    total = sum(w)
    out: StateDict = {}
    for key, x in theta.items():
        if key not in control:
            out[key] = average[key].detach().clone()
            continue
        cd = _compute_dtype(x.dtype)
        out[key] = torch.lerp(x.detach().to(cd), average[key].detach().to(cd), server_lr).to(x.dtype)
    new_control: StateDict = {}
    for key, c in control.items():
        cd = _compute_dtype(c.dtype)
        mean = sum((dc[key].detach().to(cd) * (wi / total) for dc, wi in zip(control_deltas, w)),
                   torch.zeros_like(c, dtype=cd))
        new_control[key] = (c.detach().to(cd) + participation * mean).to(c.dtype)
    return out, new_control


def scaffold_client_control(
    local_control: Mapping[str, torch.Tensor],
    control: Mapping[str, torch.Tensor],
    theta: Mapping[str, torch.Tensor],
    trained: Mapping[str, torch.Tensor],
    *,
    steps: int,
    lr: float,
) -> tuple[StateDict, StateDict]:
    """A site's new control variate, SCAFFOLD option II (Karimireddy et al. 2020, Algorithm 1, line 12).

        c_i⁺ = c_i − c + (x − y_i) / (K·η_l),     Δc_i = c_i⁺ − c_i

    per entry of ``control`` (the trainable parameters): ``local_control`` = c_i, ``control`` = c,
    ``theta`` = x (the model the site received), ``trained`` = y_i (after K = ``steps`` local
    steps at learning rate η_l = ``lr``, each y ← y − η_l·(g + c − c_i)). With plain SGD steps
    c_i⁺ is the mean gradient g the site saw this round — the reason SCAFFOLD's local optimiser
    must be plain SGD here. ``steps = 0`` (no training): c_i unchanged, Δc_i = 0. c_i starts at 0.

    Differences elsewhere: Flower's SCAFFOLD baseline (``baselines/niid_bench``) starts c_i at a
    copy of the model's weights, takes K from the planned epochs × batches and steps SGD with
    momentum 0.9; NVFLARE's ``PTScaffoldHelper`` applies the correction after any optimizer's step
    (here plain SGD only, where that is Algorithm 1's step exactly).

    Returns ``(c_i⁺, Δc_i)``; c_i stays at the site, Δc_i goes to the server.
    """
    for part, name in ((local_control, "local control c_i"), (theta, "model x"), (trained, "trained y_i")):
        missing = sorted(set(control).difference(part))
        if missing:
            raise ValueError(f"scaffold_client_control: {name} lacks {missing[:5]}")
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"scaffold_client_control: steps must be >= 0, got {steps}")
    lr = _positive("scaffold_client_control: lr", lr)
    new_local: StateDict = {}
    deltas: StateDict = {}
    for key, c in control.items():
        ci = local_control[key].detach()
        cd = _compute_dtype(ci.dtype)
        if steps == 0:
            new_local[key] = ci.clone()
            deltas[key] = torch.zeros_like(ci)
            continue
        drift = (theta[key].detach().to(cd) - trained[key].detach().to(cd)) / (steps * lr)
        plus = ci.to(cd) - c.detach().to(cd) + drift
        new_local[key] = plus.to(ci.dtype)
        deltas[key] = (plus - ci.to(cd)).to(ci.dtype)
    return new_local, deltas
