"""Global sums, derived values and site distances, against hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcxr.stats import distances as D
from fedcxr.stats.merge import estimated_cells, global_section, intensity_quantiles, merge_groups, pooled_prevalence


def payload(site: str, **groups) -> dict:
    return {"site": site, "groups": {k: {"count": c, "counts": v} for k, (c, v) in groups.items()}}


def test_global_adds_released_cells_and_stays_null_only_where_every_site_suppressed():
    a = payload("a", split=(40, [30, None, None]))
    b = payload("b", split=(20, [12, 8, None]))
    assert merge_groups([a, b]) == {"split": {"count": 60, "counts": [42, 8, None]}}


def test_global_prevalence_pools_only_sites_that_released_both_cells():
    a = payload("a", **{"label.pneumonia": (40, [10, 30, None, None])})
    b = payload("b", **{"label.pneumonia": (40, [None, 36, None, None])})  # positives suppressed: left out
    pooled = pooled_prevalence([a, b])["pneumonia"]
    assert pooled == {"value": 0.25, "sites": ["a"]}
    section = global_section({"a": a, "b": b})
    assert section["derived"]["prevalence"]["pneumonia"] == 0.25
    assert section["groups"]["label.pneumonia"]["counts"] == [10, 66, None, None]


def test_intensity_quantiles_from_a_histogram():
    counts = [0] * 256
    counts[0], counts[51], counts[255] = 50, 25, 25  # half black, a quarter at 0.2, a quarter white
    q = intensity_quantiles({"count": 100, "counts": counts}, qs=(0.25, 0.5, 0.6, 0.9))
    assert q == {"p25": 0.0, "p50": 0.0, "p60": 0.2, "p90": 1.0}


def test_suppressed_cells_share_the_undisclosed_remainder():
    assert estimated_cells({"count": 80, "counts": [44, None, None]}).tolist() == [44.0, 18.0, 18.0]
    assert estimated_cells({"count": None, "counts": [None, None]}) is None


def test_jensen_shannon_distance_by_hand():
    assert D.js_distance([1, 0], [0, 1]) == pytest.approx(1.0)
    assert D.js_distance([3, 3], [30, 30]) == pytest.approx(0.0)
    # p = (0.5, 0.5), q = (0.9, 0.1), m = (0.7, 0.3)
    kl_p = 0.5 * math.log2(0.5 / 0.7) + 0.5 * math.log2(0.5 / 0.3)
    kl_q = 0.9 * math.log2(0.9 / 0.7) + 0.1 * math.log2(0.1 / 0.3)
    assert D.js_distance([1, 1], [9, 1]) == pytest.approx(math.sqrt((kl_p + kl_q) / 2))
    assert D.js_distance([0, 0], [1, 2]) is None


def test_wasserstein1_is_the_shift_in_units_of_the_intensity_range():
    a, b = np.zeros(256), np.zeros(256)
    a[10], b[61] = 5, 7  # a point mass moved by 51 levels = 0.2 of the range
    assert D.wasserstein1(a, b) == pytest.approx(51 / 255)
    assert D.wasserstein1(a, a) == 0.0


def test_pairwise_matrices_are_symmetric_with_a_zero_diagonal_and_n_a_where_nothing_compares():
    a = payload("a", **{"label.pneumonia": (40, [10, 30, 0, 0])}, sex=(40, [20, 20, 0]))
    b = payload("b", **{"label.edema": (40, [10, 30, 0, 0])}, sex=(40, [30, 10, 0]))
    out = D.pairwise({"a": a, "b": b})
    assert out["labels"]["matrix"] == [[0.0, None], [None, 0.0]]  # no class labeled at both
    d = out["demographics"]["matrix"]
    assert d[0][1] == d[1][0] == round(D.js_distance([20, 20], [30, 10]), 6) and d[0][0] == 0.0


def test_shift_type_follows_the_measured_threshold():
    assert D.shift_type({"intensity": D.PIXEL_SHIFT_W1, "labels": 0.2})["value"] == "pixel"
    below = D.shift_type({"intensity": D.PIXEL_SHIFT_W1 / 2, "labels": None})
    assert below["value"] == "none" and "no class labeled" in below["why"]
    assert D.shift_type({"intensity": None})["value"] == "unknown"


def test_the_shift_diagnosis_says_in_words_what_its_numbers_mean():
    """"label prevalence JS 0.056 (the map's cells: 0.108)" said nothing to a user: the why names each distance,
    its scale and how it compares with the map's own targets."""
    why = D.shift_type({"intensity": 0.0123, "labels": 0.056})["why"]
    assert "Wasserstein-1 distance 0.0123" in why and f"below {D.PIXEL_SHIFT_W1}" in why
    assert "Jensen–Shannon distance 0.056" in why and "0 = the same rates, 1 = nothing in common" in why
    assert f"less different from its sources than the map's targets were from theirs ({D.MAP_PREVALENCE_JS})" in why
    assert "does not choose the map's cell" in why
    assert "about as different" in D.shift_type({"intensity": 0.1, "labels": 0.11})["why"]
    assert "more different" in D.shift_type({"intensity": 0.1, "labels": 0.3})["why"]
