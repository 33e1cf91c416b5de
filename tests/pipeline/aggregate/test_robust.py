"""Robust rules (fedcxr.pipeline.aggregate.robust): hand-computed median, trimmed mean, Krum and
norm clipping."""

from __future__ import annotations

import pytest
import torch

from fedcxr.pipeline import aggregate as A

from .states import assert_same, clone, perturbed, tiny_state


def _sites(*rows, counters=None, dtype=torch.float32):
    """States ``{"w": row, "n": counter}`` (``n`` a long counter like ``num_batches_tracked``)."""
    counters = counters or list(range(len(rows)))
    return [{"w": torch.tensor(row, dtype=dtype), "n": torch.tensor(c, dtype=torch.long)}
            for row, c in zip(rows, counters)]


def test_coordinate_median_odd_takes_a_sites_own_value_even_the_middle_mean():
    states = _sites([1.0, 5.0], [2.0, -1.0], [10.0, 0.0], counters=[3, 2, 10])
    before = [clone(s) for s in states]
    out = A.coordinate_median(states)
    assert torch.equal(out["w"], torch.tensor([2.0, 0.0])) and out["w"].dtype == torch.float32
    assert out["n"].dtype == torch.long and int(out["n"]) == 3
    even = A.coordinate_median(states + _sites([4.0, 2.0], counters=[4]))
    # w0: 1,2,4,10 → (2+4)/2; w1: -1,0,2,5 → (0+2)/2; n: 2,3,4,10 → 3.5 → 4 (ties to even)
    assert torch.equal(even["w"], torch.tensor([3.0, 1.0])) and int(even["n"]) == 4
    for s, b in zip(states, before):
        assert_same(s, b)  # inputs never mutated


def test_coordinate_median_ignores_one_arbitrary_site_of_three():
    honest = _sites([1.0, 2.0], [1.5, 2.5])
    for hostile in ([1e30, -1e30], [-1e30, 1e30], [1.2, 2.2]):
        out = A.coordinate_median(honest + _sites(hostile))["w"]
        assert bool((out >= torch.tensor([1.0, 2.0])).all() and (out <= torch.tensor([1.5, 2.5])).all())


def test_trimmed_mean_cuts_int_beta_n_from_each_end():
    states = _sites([1.0, 5.0], [2.0, -1.0], [10.0, 0.0], [4.0, 2.0], counters=[3, 2, 10, 4])
    out = A.trimmed_mean(states, 0.25)  # int(0.25·4) = 1 per side
    assert torch.equal(out["w"], torch.tensor([3.0, 1.0])) and int(out["n"]) == 4  # (3+4)/2 = 3.5 → 4
    plain = A.trimmed_mean(states, 0.2)  # int(0.8) = 0: the unweighted mean
    assert torch.allclose(plain["w"], torch.tensor([17 / 4, 6 / 4]))
    with pytest.raises(ValueError, match=r"\[0, 0.5\)"):
        A.trimmed_mean(states, 0.5)


def test_krum_scores_sum_the_n_minus_f_minus_2_closest_squared_distances():
    # 1-d points 0, 1, 2, 10, 11 with f = 1: each score sums the 2 smallest squared distances
    states = _sites([0.0], [1.0], [2.0], [10.0], [11.0], dtype=torch.float64)
    assert A.krum_scores(states, 1) == [5.0, 2.0, 5.0, 65.0, 82.0]
    assert_same(A.krum(states, 1), states[1])
    assert A.krum_select(states, 1, 3) == [1, 0, 2]  # tie 5 = 5: the lower index first
    assert torch.equal(A.multi_krum(states, 1, 3)["w"], torch.tensor([1.0], dtype=torch.float64))
    assert torch.equal(A.multi_krum(states, 1)["w"], torch.tensor([13 / 4], dtype=torch.float64))  # m = n − f = 4
    with pytest.raises(ValueError, match="2f\\+3 = 5"):
        A.krum(states[:4], 1)


def test_krum_distances_cover_every_floating_entry_and_skip_integers():
    a = {"x": torch.tensor([0.0]), "y": torch.tensor([[0.0, 0.0]]), "n": torch.tensor(0)}
    b = {"x": torch.tensor([1.0]), "y": torch.tensor([[1.0, 1.0]]), "n": torch.tensor(1000)}
    c = {"x": torch.tensor([0.0]), "y": torch.tensor([[0.0, 2.0]]), "n": torch.tensor(5)}
    # n − f − 2 = 1 closest with f = 0: a–b 3, a–c 4, b–c 3 (+ integers never counted)
    assert A.krum_scores([a, b, c], 0) == [3.0, 3.0, 3.0]


def test_norm_clipped_mean_scales_each_update_to_the_bound_then_averages():
    theta0 = {"w": torch.tensor([0.0, 0.0]), "n": torch.tensor(0)}
    states = [{"w": torch.tensor([3.0, 4.0]), "n": torch.tensor(2)}, {"w": torch.tensor([0.0, 1.0]), "n": torch.tensor(4)}]
    assert A.update_norms(theta0, states) == [5.0, 1.0]
    out = A.norm_clipped_mean(theta0, states, [1, 1], clip_norm=2.0)  # factors 0.4 and 1
    assert torch.allclose(out["w"], torch.tensor([0.6, 1.3])) and int(out["n"]) == 3
    adaptive = A.norm_clipped_mean(theta0, states, [1, 3])  # M = median(5, 1) = 3: factors 0.6 and 1
    assert torch.allclose(adaptive["w"], torch.tensor([(1.8 + 0) / 4, (2.4 + 3) / 4]))
    assert int(adaptive["n"]) == 4  # (2 + 12)/4 = 3.5 → 4
    assert A.clip_factors([5.0, 1.0, 0.0], 2.0) == (2.0, [0.4, 1.0, 1.0])  # a zero update stays as it is


def test_robust_rules_keep_dtypes_and_shapes_of_a_bn_model():
    base = tiny_state(0)
    states = [perturbed(base, s) for s in range(5)]
    for out in (A.coordinate_median(states), A.trimmed_mean(states, 0.2), A.krum(states, 1),
                A.multi_krum(states, 1), A.norm_clipped_mean(base, states, [1] * 5)):
        assert list(out) == list(base)
        for k in base:
            assert out[k].dtype == base[k].dtype and out[k].shape == base[k].shape, k
        assert int(out["1.num_batches_tracked"]) == 7  # every site's counter moved by 7
