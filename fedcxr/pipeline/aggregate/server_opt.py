"""Server optimisers that keep state across rounds: FedOpt (FedAdagrad, FedAdam, FedYogi) and
SCAFFOLD — the reviewers' baselines (not in ``../shared/papers``).

SCAFFOLD = Karimireddy et al. 2020 (ICML), Algorithm 1; FedOpt = Reddi et al. 2021 (ICLR),
Algorithm 2. FedProx (Li et al. 2020, MLSys) changes only the local loss
(:func:`fedcxr.pipeline.losses.proximal_term`); its server is
:func:`fedcxr.pipeline.aggregate.mean.fedavg`.

Both keep server state across rounds (FedOpt's moments m, v; SCAFFOLD's control variate c),
returned beside the model so the protocol checkpoints it. Both take the clients' mean model
``average`` (the protocol's FedAvg of the replies, sample-weighted or 1/K as configured), so
the pseudo-gradient / server update is ``average − θ``. They act on the entries the caller
names (the model's trainable parameters, as NVFLARE's FedOpt and SCAFFOLD); every other entry
— BatchNorm running statistics, ``num_batches_tracked`` — takes ``average`` unchanged (FedAvg):
a running variance is not a gradient-descent variable, and an adaptive step could make it
negative.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional, Sequence

import torch

from fedcxr.pipeline.aggregate.checks import _positive
from fedcxr.pipeline.state import (
    StateDict,
    _compute_dtype,
    _is_updatable,
    _require_same_structure,
    _structure_problem,
)

__all__ = ["FEDOPT_RULES", "fedopt", "scaffold", "scaffold_client_control"]

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
