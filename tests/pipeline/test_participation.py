"""Which sources a round asks (fedcxr.pipeline.participation): seeded, another share every round."""

from __future__ import annotations

import pytest

from fedcxr.pipeline.participation import sample_sites, sample_size

SOURCES = [f"hospital_{i:02d}" for i in range(20)]


@pytest.mark.parametrize("n, fraction, minimum, expected", [
    (100, 0.1, 1, 10), (100, 0.1, 15, 15), (30, 0.1, 1, 3), (7, 0.5, 1, 4), (5, 1.0, 1, 5), (5, 0.01, 1, 1),
    (3, 0.2, 5, 3), (0, 0.5, 1, 0)])
def test_a_round_asks_max_of_min_sites_and_the_rounded_up_share(n, fraction, minimum, expected):
    assert sample_size(n, fraction, minimum) == expected  # 0.1·30 is 3.0000000000000004 in floats: still 3


def test_the_same_seed_asks_the_same_subsets_and_every_round_another():
    first = [sample_sites(SOURCES, 0.25, 1, seed=7, r=r) for r in range(10)]
    again = [sample_sites(SOURCES, 0.25, 1, seed=7, r=r) for r in range(10)]
    other = [sample_sites(SOURCES, 0.25, 1, seed=8, r=r) for r in range(10)]
    assert first == again
    assert all(len(s) == 5 and len(set(s)) == 5 for s in first)
    assert len({tuple(s) for s in first}) == 10, "not the same subset every round"
    assert first != other
    assert all(s == [x for x in SOURCES if x in s] for s in first), "kept in the config's order"


def test_every_source_is_asked_about_its_share_of_the_rounds_and_fraction_one_asks_all():
    counts = {s: 0 for s in SOURCES}
    for r in range(400):
        for site in sample_sites(SOURCES, 0.25, 1, seed=0, r=r):
            counts[site] += 1
    assert all(60 <= n <= 140 for n in counts.values()), counts  # 100 expected each; binomial sd ≈ 8.7
    assert sample_sites(SOURCES, 1.0, 1, seed=0, r=3) == SOURCES
    assert sample_sites(SOURCES[:3], 0.1, 3, seed=0, r=3) == SOURCES[:3]
