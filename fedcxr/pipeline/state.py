"""State-dict plumbing shared by every layer: checks, deltas, key selection, flattening.

A ``StateDict`` (``dict[str, Tensor]``) is what sites and the server exchange. These helpers
are not aggregation rules (those live in :mod:`fedcxr.pipeline.aggregate`); they are the
arithmetic and bookkeeping every rule, protocol, transport and local-training call shares:

* :func:`check_update` — why a reply must not be aggregated (missing keys, shapes, NaN/Inf);
* :func:`delta`, :func:`apply_delta` — ``a − b`` and ``θ0 + s·Δ`` in the entries' dtypes;
* :func:`split_state`, :func:`merge_states`, :func:`keep_keys` — shallow dict surgery (FedBN);
* :func:`update_keys`, :func:`flatten_state`, :func:`unflatten` — the **one** flattening of a
  state into a vector (every non-0-dim entry in state-dict order; ``num_batches_tracked``
  left out), used by local training to record per-step updates and by auto-weighting;
* :func:`cpu_state` — a detached CPU copy of a module's state (what a site sends back).

Inputs are never mutated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

import torch

StateDict = dict[str, torch.Tensor]

__all__ = [
    "StateDict", "FlatSpec", "check_update", "nonfinite_problem", "split_state", "merge_states", "keep_keys", "delta",
    "apply_delta", "update_keys", "flatten_state", "unflatten", "cpu_state",
]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16/float32, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _is_updatable(t: torch.Tensor) -> bool:
    """Entries that GP/FedGP/FedDA combine: floating point and at least 1-dim."""
    return t.dim() > 0 and t.is_floating_point()


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_update(state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> Optional[str]:
    """Why ``state`` must not be aggregated against ``reference``, or ``None`` when it is fine.

    Checks, in order: missing entries, unexpected entries, non-tensors, shapes, integer/float
    mismatch, then NaN and ±Inf in floating entries. Both transports call this on every reply
    before aggregating, so one broken site is rejected (with this reason logged) instead of
    poisoning the global model.
    """
    return _structure_problem(state, reference) or nonfinite_problem(state)


def nonfinite_problem(state: Mapping[str, torch.Tensor]) -> Optional[str]:
    """Which floating entry of ``state`` holds NaN or ±Inf (the second half of :func:`check_update`).

    Kept apart so the protocols can tell a broken update (NaN/Inf: a diverged or poisoned
    model) from a malformed one (keys, shapes) when they look for a suspect.
    """
    for key, value in state.items():
        if not value.is_floating_point() and not value.is_complex():
            continue
        finite = torch.isfinite(value)
        if bool(finite.all()):
            continue
        n_nan = int(torch.isnan(value).sum())
        n_inf = int((~finite).sum()) - n_nan
        parts = [f"{n} {what}" for n, what in ((n_nan, "NaN"), (n_inf, "infinite")) if n]
        return f"entry {key!r} has {' and '.join(parts)} value(s)"
    return None


def _structure_problem(state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> Optional[str]:
    """Keys, types and shapes only (cheap: no pass over the values)."""
    missing = [k for k in reference if k not in state]
    if missing:
        return f"missing entries: {', '.join(map(repr, missing[:5]))}" + (" ..." if len(missing) > 5 else "")
    extra = [k for k in state if k not in reference]
    if extra:
        return f"unexpected entries: {', '.join(map(repr, extra[:5]))}" + (" ..." if len(extra) > 5 else "")
    for key, ref in reference.items():
        value = state[key]
        if not isinstance(value, torch.Tensor):
            return f"entry {key!r} is a {type(value).__name__}, not a tensor"
        if _shape(value) != _shape(ref):
            return f"entry {key!r} has shape {_shape(value)} but the model's is {_shape(ref)}"
        if value.is_floating_point() != ref.is_floating_point():
            return f"entry {key!r} has dtype {value.dtype} but the model's is {ref.dtype}"
    return None


def _require_same_structure(state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], who: str) -> None:
    problem = _structure_problem(state, reference)
    if problem:
        raise ValueError(f"{who}: {problem}")


def split_state(state: Mapping[str, torch.Tensor], keys: Iterable[str]) -> tuple[StateDict, StateDict]:
    """``(entries named in keys, all other entries)``, both in ``state`` order.

    Shallow: the tensors are shared with ``state`` (no copy). Raises ``ValueError`` naming
    keys that ``state`` lacks (a typo would otherwise silently aggregate BN layers).
    """
    wanted = set(keys)
    unknown = sorted(wanted.difference(state))
    if unknown:
        raise ValueError(f"split_state: unknown entries {unknown}")
    chosen = {k: v for k, v in state.items() if k in wanted}
    rest = {k: v for k, v in state.items() if k not in wanted}
    return chosen, rest


def merge_states(base: Mapping[str, torch.Tensor], *parts: Mapping[str, torch.Tensor]) -> StateDict:
    """``base`` with the entries of each part laid over it (later parts win).

    Key order: ``base`` order, then keys new to it in the order the parts bring them.
    Shallow (tensors shared, nothing copied). Typical use (FedBN): the aggregated shared
    entries merged with a site's own BN entries.
    """
    out = dict(base)
    for part in parts:
        out.update(part)
    return out


def keep_keys(state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], keys: Iterable[str]) -> StateDict:
    """``state`` with the entries named in ``keys`` taken (copied) from ``reference``.

    FedBN+ (DESIGN §5): the global model keeps the initial (pretrained) BN statistics, so
    after aggregation the caller restores them: ``keep_keys(global, initial, bn_keys)``.
    Keys ``state`` lacks (FedBN leaves BN out) are added. Output order follows ``reference``,
    then any keys only ``state`` has. Entries from ``state`` are shared, not copied.
    """
    kept = set(keys)
    unknown = sorted(kept.difference(reference))
    if unknown:
        raise ValueError(f"keep_keys: entries {unknown} are not in the reference state")
    for key in kept.intersection(state):
        if _shape(state[key]) != _shape(reference[key]):
            raise ValueError(
                f"keep_keys: entry {key!r} has shape {_shape(state[key])} but the reference has "
                f"{_shape(reference[key])}"
            )
    out: StateDict = {}
    for key, ref in reference.items():
        if key in kept:
            out[key] = ref.detach().clone()
        elif key in state:
            out[key] = state[key]
    for key, value in state.items():
        if key not in out:
            out[key] = value
    return out


def delta(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> StateDict:
    """``a − b`` per entry (e.g. ``delta(source, theta0)`` = Δ_i), in ``a``'s dtypes.

    Integer entries subtract exactly (``num_batches_tracked`` gives the number of steps).
    """
    _require_same_structure(a, b, "delta")
    out: StateDict = {}
    for key, x in a.items():
        y = b[key]
        if x.is_floating_point():
            cd = _compute_dtype(x.dtype)
            out[key] = torch.sub(x.to(cd), y.to(cd)).to(x.dtype)
        else:
            out[key] = torch.sub(x, y.to(x.dtype))
    return out


def apply_delta(theta0: Mapping[str, torch.Tensor], update: Mapping[str, torch.Tensor], scale: float = 1.0) -> StateDict:
    """``θ0 + scale·Δ`` per entry, in ``θ0``'s dtypes.

    Integer entries: ``round(θ0 + scale·Δ)`` computed in float64 (exact for counters).
    """
    _require_same_structure(update, theta0, "apply_delta")
    scale = float(scale)
    out: StateDict = {}
    for key, t0 in theta0.items():
        d = update[key]
        if t0.is_floating_point():
            cd = _compute_dtype(t0.dtype)
            out[key] = torch.add(t0.to(cd), d.to(cd), alpha=scale).to(t0.dtype)
        else:
            value = torch.add(t0.to(torch.float64), d.to(torch.float64), alpha=scale)
            out[key] = value.round().to(t0.dtype)
    return out


# --------------------------------------------------------------------------- flattening


def update_keys(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Entries flattened into update vectors: every non-0-dim entry, in state-dict order.

    DESIGN §5 (auto-weighting): "flattened over non-0-dim entries in state_dict order";
    ``num_batches_tracked`` (0-dim) is left out.
    """
    return [k for k, v in state.items() if v.dim() > 0]


@dataclass(frozen=True)
class FlatSpec:
    """How a flat vector maps back onto entries: keys, shapes and dtypes, in order."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @property
    def numel(self) -> int:
        """M, the length of the flat vector."""
        return sum(math.prod(s) for s in self.shapes)


def flatten_state(state: Mapping[str, torch.Tensor], keys: Optional[Sequence[str]] = None) -> tuple[torch.Tensor, FlatSpec]:
    """Concatenate the entries ``keys`` (default :func:`update_keys`) into one 1-D vector.

    Returns ``(flat, spec)``: ``flat`` has shape ``(M,)``, dtype float32 (float64 if every
    entry is float64); ``spec`` lets :func:`unflatten` rebuild the entries. Pass the same
    ``keys`` for every state whose vectors are compared (auto-weighting).
    """
    keys = update_keys(state) if keys is None else list(keys)
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"flatten_state: unknown entries {missing}")
    tensors = [state[k].detach() for k in keys]
    spec = FlatSpec(tuple(keys), tuple(_shape(t) for t in tensors), tuple(t.dtype for t in tensors))
    if not tensors:
        return torch.zeros(0), spec
    cd = torch.float64 if all(t.dtype == torch.float64 for t in tensors) else torch.float32
    return torch.cat([t.reshape(-1).to(cd) for t in tensors]), spec


def unflatten(flat: torch.Tensor, spec: FlatSpec) -> StateDict:
    """Inverse of :func:`flatten_state`: fresh tensors with the spec's shapes and dtypes."""
    if flat.dim() != 1 or flat.numel() != spec.numel:
        raise ValueError(f"unflatten: expected a vector of {spec.numel} values, got shape {_shape(flat)}")
    out: StateDict = {}
    offset = 0
    for key, shape, dtype in zip(spec.keys, spec.shapes, spec.dtypes):
        n = math.prod(shape)
        piece = flat[offset : offset + n].reshape(shape)
        if not dtype.is_floating_point:
            piece = piece.round()
        out[key] = piece.to(dtype, copy=True)
        offset += n
    return out



def cpu_state(model: torch.nn.Module) -> StateDict:
    """A detached CPU copy of ``model.state_dict()`` (safe to send, store or aggregate).

    Always in the default (contiguous) layout, also when the model trains channels-last.
    """
    return {k: v.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
            for k, v in model.state_dict().items()}
