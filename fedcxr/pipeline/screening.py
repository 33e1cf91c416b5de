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
* :func:`bn_shift` — how far a reply moves the BatchNorm running statistics, in the units of
  those statistics themselves (the scale-free statistic their relative check compares).
* :func:`size_problem`, :func:`credited_rows`, :func:`capped_counts` — a site's size is not its
  own word alone: bounded by a plausibility limit and the consortium's declared sizes, by the
  other sites' sizes for the step budget its norm is judged by, and by ``max_share`` for its
  weight in any sample-weighted rule.
* :func:`refusal_pattern` — sites refused in every round while others never are: a signal of
  its own (a poisoned model refuses the honest majority; a lone faulty site is the minority).

Messages never format an unbounded value: a 400-digit count is described by its length.
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable, Mapping, Optional

import torch

# MAX_SITE_ROWS (10⁸), the most training rows one site may report: the largest public chest X-ray
# collections hold well under a million (MIMIC-CXR ~377,000, CheXpert ~224,000), so a larger claim
# is a lie or a broken client that would otherwise buy a sample-weighted mean outright (issue 27:
# 10¹² rows took 100 % of FedAvg's weight). Kept with the config's other bounds.
from fedcxr.pipeline.config_bounds import MAX_SITE_ROWS

#: The largest count a reply may claim: every integer up to it is exact in float64.
MAX_COUNT = 2**53
#: BatchNorm's own ε: the floor of a running variance when a shift is measured in its units.
BN_EPS = 1e-5
#: A BatchNorm shift (:func:`bn_shift`) up to half a standard deviation, RMS over the channels,
#: is never refused by comparison with the others: a hospital whose images differ can honestly move
#: its statistics that far while the others, already converged, hardly move (the case where a
#: leave-one-out median misjudges an honest outlier). The price, measured (BENCHMARKS.md "Adaptive
#: attacks on the defences"): one site of five shifting every running mean by 0.5 σ every round
#: costs ~0.03 AUROC, by 1 σ ~0.1, by 2 σ the model.
BN_FLOOR = 0.5


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

    ``steps`` when the task fixes it, else ``epochs × ⌈min(n_samples, max_rows) / batch_size⌉``
    (the loader keeps a last partial batch; a batch of one under BatchNorm is skipped, so honest
    sites take at most this many). ``None`` when the config does not say.
    """
    try:
        if config.get("steps") is not None:
            return max(int(config["steps"]), 0)
        batch_size = int(config["batch_size"])
        epochs = int(config.get("epochs", 1))
        rows = int(n_samples)
        if config.get("max_rows"):
            rows = min(rows, int(config["max_rows"]))
    except (KeyError, TypeError, ValueError):
        return None
    if batch_size < 1:
        return None
    return max(epochs, 0) * math.ceil(rows / batch_size)


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


class UpdateNorms:
    """Replies' update norms against one reference, each entry's ``‖Δ_k‖²`` computed once per reply.

    Why: every reply is screened twice by norm — the absolute bound (``‖Δ‖`` over the floating
    entries that are not the site's own, against ``‖θ0‖``) and the relative one (per step and unit of
    lr, without BatchNorm's running statistics) — and each pass converted both models to float64
    entry by entry, ``θ0`` again for every reply: at a hundred sites that cost as much as their
    training. Here ``θ0``'s float64 entries and norms are kept while the reference is the same
    object, a reply's squared entry norms while it is, and each norm is the sum of the squares of its
    keys in state-dict order — the same floats as :func:`~fedcxr.pipeline.aggregate.update_norms` and
    :func:`state_norm` give. One instance serves a process; it holds one reference and one reply.
    """

    def __init__(self) -> None:
        self._reference: Optional[Mapping[str, torch.Tensor]] = None
        self._ref64: dict[str, torch.Tensor] = {}
        self._ref_norms: dict[frozenset, float] = {}
        self._ref_finite: Optional[bool] = None
        self._ref_flat: Optional[torch.Tensor] = None
        self._ref_sizes: list[int] = []
        self._params: Optional[Mapping[str, torch.Tensor]] = None
        self._squares: dict[str, float] = {}

    def _use(self, reference: Mapping[str, torch.Tensor]) -> None:
        if reference is not self._reference:
            self._reference = reference
            self._ref64 = {k: v.detach().to(torch.float64) for k, v in reference.items() if v.is_floating_point()}
            self._ref_norms, self._ref_finite = {}, None
            self._ref_flat, self._ref_sizes = None, []
            self._params, self._squares = None, {}

    def squares(self, reference: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """``{k: ‖params[k] − reference[k]‖²}`` over the reference's floating entries (float64).
        ``params`` must hold those entries (its structure checked)."""
        self._use(reference)
        if params is not self._params:
            self._params = params
            self._squares = self._flat_squares(params)
            if self._squares is None:  # entries of another size (never after the structure check): one by one
                self._squares = {k: float(torch.sub(params[k].detach().to(torch.float64), ref).square().sum())
                                 for k, ref in self._ref64.items()}
        return self._squares

    def _flat_squares(self, params: Mapping[str, torch.Tensor]) -> Optional[dict[str, float]]:
        """:meth:`squares` in a few whole-model operations: the entries concatenated into one float64
        vector, one subtraction and one square for all of them, then each entry's slice summed.

        Why: per entry it was four small operations (convert, subtract, square, sum) — about 250
        for resnet_tiny, a few milliseconds a reply, paid by every reply of every round. The values
        are the same floats: conversion, subtraction and squaring act element by element, and each
        entry's sum runs over the same contiguous values in the same order
        (``tests/pipeline/test_screening.py`` compares with the per-entry sums)."""
        keys = list(self._ref64)
        if not keys:
            return {}
        if self._ref_flat is None:
            self._ref_sizes = [v.numel() for v in self._ref64.values()]
            self._ref_flat = torch.cat([v.reshape(-1) for v in self._ref64.values()])
        parts = [params[k].detach() for k in keys]
        if any(p.numel() != n for p, n in zip(parts, self._ref_sizes)):
            return None
        flat = torch.cat([p.reshape(-1) for p in parts]).to(torch.float64)
        squared = torch.sub(flat, self._ref_flat).square()
        sums = torch.stack([piece.sum() for piece in squared.split(self._ref_sizes)]).tolist()
        return dict(zip(keys, sums))

    def norm(self, reference: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor],
             keys: Iterable[str]) -> float:
        """``‖params − reference‖`` over ``keys`` (floating entries of the reference), summed in their order."""
        squares = self.squares(reference, params)
        total = 0.0
        for key in keys:
            total += squares[key]
        return math.sqrt(total)

    def finite(self, reference: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor]) -> bool:
        """True when every floating entry of ``params`` is certainly finite: each squared difference
        from a finite reference is (a NaN or ±Inf makes it so; ``False`` only says: look closer)."""
        squares = self.squares(reference, params)
        return (all(math.isfinite(v) for v in squares.values()) and self.reference_finite()
                and not any(v.is_complex() for v in params.values()))

    def reference_finite(self) -> bool:
        if self._ref_finite is None:
            self._ref_finite = all(bool(torch.isfinite(v).all()) for v in self._ref64.values())
        return self._ref_finite

    def reference_norm(self, reference: Mapping[str, torch.Tensor], exclude: Iterable[str] = ()) -> float:
        """:func:`state_norm` of the reference, kept per ``exclude``."""
        self._use(reference)
        key = frozenset(exclude)
        if key not in self._ref_norms:
            self._ref_norms[key] = state_norm(reference, exclude=key)
        return self._ref_norms[key]


# --------------------------------------------------------------------------- BatchNorm running statistics


def bn_stat_keys(state: Mapping[str, torch.Tensor], exclude: Iterable[str] = ()) -> list[str]:
    """The floating BatchNorm ``running_mean``/``running_var`` entries of ``state`` not in ``exclude``."""
    skip = set(exclude)
    return [k for k, v in state.items() if k.endswith(("running_mean", "running_var")) and v.is_floating_point()
            and k not in skip]


def bn_shift(reference: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor],
             keys: Iterable[str]) -> Optional[float]:
    """How far ``params`` moves the BatchNorm running statistics of ``reference``, in their own units.

    Per channel ``c`` of every BN layer, with ``v0``/``v1`` the reference's and the reply's running
    variance and ``σ = √(max(v0, v1) + ε)``::

        z_c² = ((μ1 − μ0) / σ)²  +  (log((v1 + ε) / (v0 + ε)))²

    and the result is ``√(mean_c z_c²)``: the mean shift in standard deviations, the variance
    change as a log-ratio (a factor e is 1). Why these units: running statistics do not move
    with the learning rate (a site's BN layers converge to its own data's moments in a few
    dozen steps, whatever lr), so the per-step, per-lr statistic of the weights says nothing
    about them; and a raw norm mixes means (units of x) with variances (x²) and depends on the
    layer's scale. In σ units every layer counts alike, an honest site's change is the distance
    between its data's moments and the global ones, and the attack issue 27 measured — every
    running mean shifted by far more than its spread — stands out. Hiding a mean shift behind a
    larger variance costs the same in the log-ratio term. A negative variance (its own check,
    :func:`negative_variance`) counts as ε. ``None`` when ``keys`` holds no running statistic.

    Why the change from the model sent rather than each reply's distance to the others'
    statistics: with three replies the others' median is the mean of two, one of them the
    hostile one, which drags every honest distance halfway to its own; the change from the
    server's own model cannot be dragged. Honest sites' changes are alike (measured: within
    1.3× of each other on IID and on the synthetic hospitals), hence ``defences.bn_factor`` 3.
    """
    total, channels = 0.0, 0
    for key in keys:
        if not key.endswith("running_mean"):
            continue
        prefix = key[: -len("running_mean")]
        mean0 = reference[key].detach().to(torch.float64)
        mean1 = params[key].detach().to(torch.float64)
        var_key = prefix + "running_var"
        if var_key in reference and var_key in params:
            z2 = _bn_z2(mean0, mean1, _bn_variance(reference[var_key]), _bn_variance(params[var_key]))
        else:  # a running mean without its variance (no fedcxr network has one): raw units
            z2 = (mean1 - mean0).square()
        total += float(z2.sum())
        channels += mean0.numel()
    if channels == 0:
        return None
    value = math.sqrt(total / channels)
    return value if math.isfinite(value) else math.inf


def _bn_variance(variance: torch.Tensor) -> torch.Tensor:
    """A running variance in float64, a negative one counted as ε (:func:`bn_shift`)."""
    return variance.detach().to(torch.float64).clamp(min=0) + BN_EPS


def _bn_z2(mean0: torch.Tensor, mean1: torch.Tensor, var0: torch.Tensor, var1: torch.Tensor) -> torch.Tensor:
    """Each channel's squared change in σ units plus its variance's log-ratio squared: the one
    formula of :func:`bn_shift` and :class:`BnShifts` (element by element, so the same floats)."""
    return (mean1 - mean0).square() / torch.maximum(var0, var1) + torch.log(var1 / var0).square()


class BnShifts:
    """:func:`bn_shift` of many replies against one reference, the reference's statistics prepared once.

    Why: per BatchNorm layer :func:`bn_shift` converts four vectors and takes ~8 small operations;
    at a hundred replies a round, against the same reference, that is ~20 % of the screening. Here
    the reference's running means and variances are concatenated into float64 vectors once, a
    reply's in one concatenation each, ``z²`` is computed for every channel at once, and each
    layer's sum is added in :func:`bn_shift`'s order — the same float (element-wise operations,
    the same contiguous values per layer; ``tests/pipeline/test_screening.py`` compares the two).
    A layer without its variance goes to :func:`bn_shift` itself.
    """

    def __init__(self) -> None:
        self._reference: Optional[Mapping[str, torch.Tensor]] = None
        self._prepared: dict[tuple, tuple] = {}

    def shift(self, reference: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor],
              keys: Iterable[str]) -> Optional[float]:
        keys = tuple(keys)
        if reference is not self._reference:
            self._reference, self._prepared = reference, {}
        if keys not in self._prepared:
            self._prepared[keys] = self._prepare(reference, keys)
        prepared = self._prepared[keys]
        if prepared is None:
            return bn_shift(reference, params, keys)
        means, variances, sizes, mean0, var0 = prepared
        if not sizes:
            return None
        if any(key not in params for key in means + variances) \
                or any(params[m].numel() != n or params[v].numel() != n for m, v, n in zip(means, variances, sizes)):
            return bn_shift(reference, params, keys)
        mean1 = torch.cat([params[k].detach().reshape(-1) for k in means]).to(torch.float64)
        var1 = _bn_variance(torch.cat([params[k].detach().reshape(-1) for k in variances]))
        z2 = _bn_z2(mean0, mean1, var0, var1)
        total = 0.0
        for value in torch.stack([piece.sum() for piece in z2.split(sizes)]).tolist():
            total += value
        value = math.sqrt(total / sum(sizes))
        return value if math.isfinite(value) else math.inf

    @staticmethod
    def _prepare(reference: Mapping[str, torch.Tensor], keys: tuple) -> Optional[tuple]:
        means = [k for k in keys if k.endswith("running_mean")]
        variances = [k[: -len("running_mean")] + "running_var" for k in means]
        if any(v not in reference for v in variances):
            return None
        sizes = [reference[k].numel() for k in means]
        if any(reference[v].numel() != n for v, n in zip(variances, sizes)):
            return None
        if not means:
            return [], [], [], None, None
        mean0 = torch.cat([reference[k].detach().reshape(-1) for k in means]).to(torch.float64)
        var0 = _bn_variance(torch.cat([reference[k].detach().reshape(-1) for k in variances]))
        return means, variances, sizes, mean0, var0


# --------------------------------------------------------------------------- sizes and weights


def size_problem(value, declared: Optional[int] = None) -> Optional[str]:
    """Why a site's reported training-row count cannot be believed at the start of a run, or ``None``.

    Not a count (:func:`count_problem`), above :data:`MAX_SITE_ROWS`, or above the size the
    consortium declared for the site (``defences.declared_sizes``)."""
    reason = count_problem(value, "n_samples")
    if reason:
        return reason
    if int(value) > MAX_SITE_ROWS:
        return (f"n_samples claims {describe_number(value)} training rows, more than any one site plausibly holds "
                f"({MAX_SITE_ROWS:,})")
    if declared is not None and int(value) > int(declared):
        return (f"n_samples claims {int(value)} training rows, more than the {int(declared)} the consortium declared "
                "for it (defences.declared_sizes)")
    return None


def credited_rows(sizes: Mapping[str, int], site: str, max_share: Optional[float]) -> int:
    """The training rows the server credits ``site`` with when it plans the site's step budget.

    ``sizes``: every source's size as the server knows it (reported at the start of the run,
    at most its declared size). With at least three sources and a ``max_share`` s < 1, a site
    is credited at most ``s/(1−s)`` × the other sources' rows together — the size at which its
    share of the consortium's rows would be s (s = 0.5: no more than all the others together).
    A site that inflates its size buys a larger step budget, and the relative norm check
    divides by that budget; crediting it with no more than its share keeps the check from
    scaling with the lie. An honest site never reaches the bound in a balanced consortium.
    """
    own = int(sizes[site])
    if max_share is None or max_share >= 1 or len(sizes) < 3:
        return own
    others = sum(int(n) for s, n in sizes.items() if s != site)
    return min(own, int(math.floor(max_share / (1.0 - max_share) * others)))


def capped_counts(counts: list[int], max_share: Optional[float]) -> list[int]:
    """Sample counts whose shares are at most ``max_share`` (the same list when none exceeds it).

    Only the counts above their share are lowered, to the common value ``c`` at which each of
    them holds ``max_share`` (``c = s·U / (1 − s·|C|)``, U the uncapped counts' sum, rounded
    down to a count; repeated until no other count exceeds its share — water-filling); the others keep their
    counts, so a rule that also reads counts as sizes (GP's step-magnitude scaling) sees honest
    sites unchanged. When ``max_share`` × the number of counts is below 1 no weighting can meet
    the cap and every count becomes the smallest one (equal weights, the closest to it).
    Needs three counts (with two, the cap would only make them equal: there is no majority
    whose weight it protects); fewer are returned as given.
    """
    if max_share is None or max_share >= 1 or len(counts) < 3 or sum(counts) <= 0:
        return counts
    values = [int(c) for c in counts]
    equal = [min(values)] * len(values)
    if max_share * len(values) < 1:
        return equal if max(values) > min(values) else counts
    capped: set[int] = set()
    while True:
        rest = sum(v for i, v in enumerate(values) if i not in capped)
        cap = max_share * rest / (1.0 - max_share * len(capped))
        over = {i for i, v in enumerate(values) if i not in capped and v > cap}
        if not over:
            break
        capped |= over
        if len(capped) == len(values):  # only at s·n = 1 up to rounding: equal weights meet it
            return equal
    if not capped:
        return counts
    credited = max(1, int(math.floor(cap)))  # a count: the share lands at or just under max_share
    return [credited if i in capped else counts[i] for i in range(len(counts))]


# --------------------------------------------------------------------------- who is refused


def refusal_pattern(refused: Iterable[Mapping], sites: Iterable[str], rounds: Iterable[int]) -> Optional[dict]:
    """``{"rounds", "always_refused", "never_refused"}`` when, over at least two rounds, some of
    ``sites`` had a reply refused in every one of ``rounds`` while others never had one; else None.

    A lone faulty site refused every round is what the checks are for; the same pattern with the
    honest majority refused and one site never refused is what a poisoned model looks like (the
    site whose update got in stays plausible against a model it made). Either way it is named.
    """
    rounds = sorted(set(int(r) for r in rounds))
    sites = list(sites)
    if len(rounds) < 2:
        return None
    hit: dict[str, set[int]] = {}
    for entry in refused:
        hit.setdefault(str(entry.get("site")), set()).add(entry.get("round"))
    always = [s for s in sites if hit.get(s, set()) >= set(rounds)]
    never = [s for s in sites if not hit.get(s)]
    if not always or not never:
        return None
    return {"rounds": len(rounds), "always_refused": always, "never_refused": never}
