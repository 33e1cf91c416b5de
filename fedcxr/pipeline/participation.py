"""Which source sites a round asks (``participation:``; README "Running a consortium"). Pure, a leaf.

Flower's ``FedAvg`` samples ``max(⌈fraction_fit·N⌉, min_fit_clients)`` of the available clients each
round; FLARE's ``FedAvg`` controller samples ``num_clients`` of them. fedcxr does the same from the
run's seed and the round number (:func:`~fedcxr.pipeline.keys.derive_seed`), so that the same seed
asks the same subsets, every round asks another subset, a resumed run asks what the uninterrupted
one asked, and FLARE and in-process runs ask the same sites. The draw depends on nothing else (not
on who answered before), so a site that missed one round is as likely as any to be asked the next.

The asked sites keep the order of ``sources`` (the config's ``sites:``): the server sums replies
in that order whatever the draw, as it does without sampling.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

from fedcxr.pipeline.keys import derive_seed


def sample_size(n_sources: int, fraction: float, min_sites: int) -> int:
    """How many of ``n_sources`` a round asks: ``max(min_sites, ⌈fraction·n⌉)``, at most ``n``.

    ``⌈·⌉`` of a product that floats make a hair above a whole number (0.1·30 = 3.0000000000000004)
    is that whole number: a fraction of exactly k/n asks k sites."""
    if n_sources <= 0:
        return 0
    share = round(fraction * n_sources, 9)
    return min(n_sources, max(int(min_sites), math.ceil(share)))


def sample_sites(sources: Sequence[str], fraction: float, min_sites: int, seed: int, r: int) -> list[str]:
    """The sources round ``r`` asks: :func:`sample_size` of them drawn from ``(seed, r)``, in ``sources`` order.

    Every source when the size is all of them (``fraction: 1``, the default): no draw at all."""
    sources = list(sources)
    k = sample_size(len(sources), fraction, min_sites)
    if k >= len(sources):
        return sources
    chosen = set(random.Random(derive_seed(seed, "participation", r)).sample(range(len(sources)), k))
    return [s for i, s in enumerate(sources) if i in chosen]


__all__ = ["sample_sites", "sample_size"]
