"""Checks of one site's reply before it may touch the model: counts and update norms (SECURITY.md).

Pure functions (no protocol, no transport): :mod:`fedcxr.pipeline.protocols.base` applies them
to every reply of every round, so the in-process simulation and NVIDIA FLARE screen alike.

* :func:`count_problem` — a claimed sample or step count must be a plain non-negative integer,
  at most :data:`MAX_COUNT`, and at most what the site reported at the start of the run
  (a 10¹² or 10⁴⁰⁰ claim is refused before any arithmetic, so it can neither take over a
  sample-weighted mean nor overflow a float).
* :func:`negative_variance` — a BatchNorm running variance below zero (no training makes one).
* :func:`planned_steps` — the most optimiser steps a ``train`` task allows.
* :func:`step_norm` — an update's norm per optimiser step and unit of learning rate: sites
  with more rows take more steps and the target trains at its own learning rate, so raw
  norms differ between honest sites; this statistic does not (Adam moves each weight by
  about ``lr`` per step).
* :func:`norm_outliers` — which statistics exceed ``k`` × the median of the *other* replies.
  A leave-one-out median needs two others: with two replies nobody can tell which one is
  wrong (a tiny update would make the honest one look huge), so there only the absolute
  bound (``defences.norm_limit``, ``‖Δ‖ ≤ R·‖θ0‖``) applies.

Messages never format an unbounded value: a 400-digit count is described by its length.
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable, Mapping, Optional

import torch

#: The largest count a reply may claim: every integer up to it is exact in float64.
MAX_COUNT = 2**53


def describe_number(value) -> str:
    """A short, bounded description of a claimed count (never a 400-digit string)."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, numbers.Integral):
        value = int(value)
        if abs(value) < 10**15:
            return str(value)
        digits = int(abs(value).bit_length() * math.log10(2)) + 1
        return f"a {digits}-digit number"
    if isinstance(value, float):
        return repr(value)
    return f"a {type(value).__name__}"


def count_problem(value, what: str, limit: Optional[int] = None, limit_source: str = "") -> Optional[str]:
    """Why ``value`` is not an acceptable ``what`` (``n_samples``, ``n_batches``), or ``None``.

    Refused: ``bool``, anything that is not an integer (1.5, ``inf``, a string), negative
    values, values above :data:`MAX_COUNT`, and values above ``limit`` (what the site said
    at the start of the run, ``limit_source`` says so).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return f"{what} is {describe_number(value)}, not an integer count"
    value = int(value)
    if value < 0:
        return f"{what} is {describe_number(value)}, a negative count"
    if value > MAX_COUNT:
        return f"{what} is {describe_number(value)}, above any plausible count ({MAX_COUNT})"
    if limit is not None and value > limit:
        return f"{what} claims {value}, more than the {limit} {limit_source}".rstrip()
    return None


def negative_variance(state: Mapping[str, torch.Tensor]) -> Optional[str]:
    """Which BatchNorm ``running_var`` entry holds negative values, or ``None``.

    A variance is never negative, and BN training and FedAvg keep it so (a blend of non-negative
    values); a negative one makes every prediction NaN (``sqrt`` of it) while training, which runs
    on batch statistics, goes on unaware. A sign-flipped update produces exactly that."""
    for key, value in state.items():
        if key.endswith("running_var") and value.is_floating_point():
            negative = int((value < 0).sum())
            if negative:
                return f"entry {key!r} has {negative} negative value(s), and a variance cannot be negative"
    return None


def planned_steps(config: Mapping, n_samples: int) -> Optional[int]:
    """The most optimiser steps a ``train`` task config allows for ``n_samples`` rows.

    ``steps`` when the task fixes it, else ``epochs × ⌈n_samples / batch_size⌉`` (the loader
    keeps a last partial batch; a batch of one under BatchNorm is skipped, so honest sites
    take at most this many). ``None`` when the config does not say.
    """
    try:
        if config.get("steps") is not None:
            return max(int(config["steps"]), 0)
        batch_size = int(config["batch_size"])
        epochs = int(config.get("epochs", 1))
    except (KeyError, TypeError, ValueError):
        return None
    if batch_size < 1:
        return None
    return max(epochs, 0) * math.ceil(int(n_samples) / batch_size)


def step_norm(norm: float, lr: float, steps: int) -> float:
    """``‖Δ‖ / (lr · max(steps, 1))``: the update per optimiser step and unit of learning rate."""
    return float(norm) / (float(lr) * max(int(steps), 1))


def state_norm(state: Mapping[str, torch.Tensor], exclude: Iterable[str] = ()) -> float:
    """``‖θ‖`` over every floating entry not in ``exclude`` (float64 sums): the scale an update is judged by."""
    skip = set(exclude)
    return math.sqrt(sum(float(v.detach().to(torch.float64).square().sum())
                         for k, v in state.items() if v.is_floating_point() and k not in skip))


def median(values) -> float:
    """The median; the mean of the two middle values for an even count."""
    ordered = sorted(float(v) for v in values)
    if not ordered:
        raise ValueError("median of no values")
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def norm_outliers(stats: Mapping[str, float], factor: float,
                  others: Optional[Mapping[str, float]] = None) -> dict[str, tuple[float, float]]:
    """``{site: (its statistic, the reference)}`` for each statistic above ``factor`` × the
    median of the other sites' statistics (leave-one-out).

    ``others``: a fixed pool to compare against instead (the round's sources, for a target
    that trains after them). A site is compared only when at least two other values exist.
    """
    out = {}
    for site, value in stats.items():
        pool = [v for s, v in (others if others is not None else stats).items() if s != site]
        if len(pool) < 2:
            continue
        reference = median(pool)
        if reference > 0 and value > factor * reference:  # others that did not move: nothing to judge by
            out[site] = (value, reference)
    return out
