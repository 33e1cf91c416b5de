"""FedAvg and FedBN: the sample-weighted mean of state dicts, whole or fed one reply at a time.

:class:`StreamingAverage` holds one running sum, so the federation adds each reply as it arrives
and drops it (memory: one model whatever the number of sites); :func:`fedavg` and :func:`fedbn`
are the same mean over a list. FedAvg averages every entry, integer ones as a weighted mean
rounded back to their dtype; FedBN leaves the named (BatchNorm) entries out of the result. The
surgical-aggregation backbone (its Eq. 1) is :func:`fedavg` with equal weights; FedProx's server
(Li et al. 2020) is :func:`fedavg` too.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional, Sequence

import torch

from fedcxr.pipeline.state import StateDict, _compute_dtype, _structure_problem

__all__ = ["StreamingAverage", "fedavg", "fedavg_streaming", "fedbn"]


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
            self._accumulate(body, weight)
        self.total_weight += weight
        self.count += 1

    def _accumulate(self, body: Mapping[str, torch.Tensor], weight: float) -> None:
        """``acc += weight · value`` for every entry: those already in the sum's dtype and device in
        one ``torch._foreach_add_`` (on a CPU it runs ``add_`` tensor by tensor — the same floats,
        without a Python round trip per entry: at a hundred replies a round those were ~70 calls
        each), the others (integer entries summed in float64) converted one by one as before."""
        same, values = [], []
        for key, acc in self._sum.items():
            value = body[key].detach()
            if value.dtype == acc.dtype and value.device == acc.device and value.shape == acc.shape:
                same.append(acc)
                values.append(value)
            else:
                acc.add_(value.to(acc.dtype), alpha=weight)
        if same:
            torch._foreach_add_(same, values, alpha=weight)

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
