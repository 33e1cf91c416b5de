"""What leaves a site: min-count and complementary suppression, Laplace noise, the last check."""

from __future__ import annotations

import numpy as np
import pytest

from fedcxr.errors import UserError
from fedcxr.stats.release import check_payload, noise_scales, release, suppress
from fedcxr.stats.site import SiteCounts


def counts(**groups) -> SiteCounts:
    return SiteCounts(site="a", groups={k: np.array(v, dtype=np.int64) for k, v in groups.items()}, image_size=4,
                      class_set=["pneumonia"])


def test_cells_below_k_are_null_and_zeros_count_as_below_k():
    assert suppress(np.array([10, 7, 0]), 5) == [10, 7, None]  # the hidden cells sum to 0: nothing to recover


def test_one_small_cell_hides_the_smallest_shown_cell_so_the_total_cannot_give_it_away():
    # total 80 is sent: with only "2" hidden, 80 − 40 − 38 = 2 would be exact
    assert suppress(np.array([40, 38, 2]), 5) == [40, None, None]


def test_two_small_cells_that_can_trade_values_need_no_partner():
    # hidden 3 + 1 = 4: (0, 4), (1, 3), (2, 2), (3, 1), (4, 0) all give this release
    assert suppress(np.array([50, 3, 1, 9, 6]), 5) == [50, None, None, 9, 6]


def test_release_sends_only_counts_of_at_least_k_or_null():
    payload = release(counts(split=[30, 3, 7], **{"label.pneumonia": [4, 36, 0, 0]}), min_count=5)
    assert payload["groups"]["split"] == {"count": 40, "counts": [30, None, None]}
    # positive 4 with two zeros: the three hidden cells hold 4 between them, in many ways
    assert payload["groups"]["label.pneumonia"] == {"count": 40, "counts": [None, 36, None, None]}
    assert payload["status"] == "ok"
    check_payload(payload, 5)


def test_a_site_below_k_rows_sends_only_its_status():
    payload = release(counts(split=[2, 1, 1], sex=[2, 2, 0]), min_count=5)
    assert payload["status"] == "suppressed" and payload["groups"] == {}
    check_payload(payload, 5)


def test_a_site_below_k_in_every_cell_says_so():
    payload = release(counts(split=[3, 3, 3], sex=[4, 4, 1]), min_count=5)
    assert payload["groups"]["split"] == {"count": 9, "counts": [None, None, None]}
    assert payload["message"] == "every cell below 5 or beside one: only group totals were sent"


def test_a_group_whose_total_is_below_k_sends_nothing_but_nulls():
    payload = release(counts(split=[10, 0, 0], train_labels=[3, 0]), min_count=5)
    assert payload["groups"]["train_labels"] == {"count": None, "counts": [None, None]}


def test_check_payload_finds_a_small_count_anywhere_under_count_keys():
    with pytest.raises(ValueError, match=r"\.groups\.x\.counts\[1\] = 2"):
        check_payload({"groups": {"x": {"count": 9, "counts": [7, 2]}}}, 5)
    with pytest.raises(ValueError, match="extra.count = 1.5"):
        check_payload({"extra": {"count": 1.5}}, 1)
    check_payload({"groups": {"x": {"count": None, "counts": [None, 5]}}, "min_count": 5, "rows": 2}, 5)


def test_laplace_scale_splits_epsilon_over_groups_and_uses_pixels_per_image_for_intensity():
    scales = noise_scales(["split", "sex", "intensity"], image_size=4, epsilon=1.5)
    assert scales == {"split": 2.0, "sex": 2.0, "intensity": 32.0}  # sensitivity · G / ε = 1·3/1.5, 16·3/1.5


def test_noisy_release_is_noisy_whole_and_still_held_to_k():
    site = counts(split=[400, 300, 200], sex=[450, 440, 10])
    draws = [release(site, min_count=5, epsilon=1.0, rng=np.random.default_rng(seed)) for seed in range(20)]
    values = [d["groups"]["split"]["counts"][0] for d in draws]
    assert len(set(values)) > 1 and all(isinstance(v, int) for v in values)
    assert abs(np.mean(values) - 400) < 5  # Laplace(0, 2): unbiased, sd ≈ 2.8
    for d in draws:
        check_payload(d, 5)
        assert d["privacy"]["epsilon_per_group"] == 0.5


def test_privacy_options_are_checked():
    with pytest.raises(UserError, match="--min-count"):
        release(counts(split=[10, 0, 0]), min_count=0)
    with pytest.raises(UserError, match="--epsilon"):
        release(counts(split=[10, 0, 0]), epsilon=-1.0)
