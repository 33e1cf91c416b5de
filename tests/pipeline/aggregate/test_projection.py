"""GP, FedGP and FedDA (fedcxr.pipeline.aggregate.projection): hand-computed cases for every edge
case of DESIGN §5, plus float64 numpy references written straight from the formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedcxr.pipeline import aggregate as A
from fedcxr.pipeline.aggregate import projection

from .states import assert_close, assert_same, clone, perturbed, t, tiny_state, unit_scales


def gp_reference(theta0, target, sources, *, betas, n_sources, n_target, bs_source, bs_target,
                 lr_source, lr_target, epochs_source=1, epochs_target=1, target_coef=None):
    """DESIGN §5 literally, per entry, in float64 numpy (FedGP form; GP = equal betas)."""
    total = sum(n_sources)
    out = {}
    for k, v0 in theta0.items():
        if v0.dim() == 0 or not v0.is_floating_point():
            out[k] = v0.clone()
            continue
        x0 = v0.double().numpy().ravel()
        dt = target[k].double().numpy().ravel() - x0
        acc = x0.copy()
        for src, beta, n_i in zip(sources, betas, n_sources):
            di = src[k].double().numpy().ravel() - x0
            c = float(dt @ di) / (max(np.linalg.norm(dt), 1e-8) * max(np.linalg.norm(di), 1e-8))
            s = (lr_target / lr_source) * (epochs_target / epochs_source) * ((n_target / bs_target) / (n_i / bs_source)) * (n_i / total)
            if c > 0:
                acc += beta * s * c * di
            acc += (1 - beta) * (n_i / total) * dt
        out[k] = torch.from_numpy(acc.reshape(tuple(v0.shape))).to(v0.dtype)
    return out


SCALES = dict(n_sources=[30, 50, 20], n_target=12, bs_source=8, bs_target=4, lr_source=1e-3,
              lr_target=2e-4, epochs_source=2, epochs_target=3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gp_and_fedgp_match_the_design_formula_on_a_real_state_dict(seed):
    theta0 = tiny_state(seed)
    target = perturbed(theta0, 100 + seed)
    sources = [perturbed(theta0, 200 + seed + i) for i in range(3)]
    inputs = [clone(s) for s in (theta0, target, *sources)]
    out = A.gp(theta0, target, sources, beta=0.3, **SCALES)
    ref = gp_reference(theta0, target, sources, betas=[0.3] * 3, **SCALES)
    assert_close(out, ref, rtol=1e-5, atol=1e-6)
    betas = [0.1, 0.9, 0.5]
    assert_close(A.fedgp(theta0, target, sources, betas=betas, **SCALES),
                 gp_reference(theta0, target, sources, betas=betas, **SCALES), rtol=1e-5, atol=1e-6)
    for original, now in zip(inputs, (theta0, target, *sources)):
        assert_same(original, now)
    # num_batches_tracked keeps θ0 though every input moved it.
    assert int(out["1.num_batches_tracked"]) == seed


def fedda_reference(theta0, target, sources, *, betas, n_sources):
    total = sum(n_sources)
    out = {}
    for k, v0 in theta0.items():
        if v0.dim() == 0 or not v0.is_floating_point():
            out[k] = v0.clone()
            continue
        x0, dt = v0.double(), target[k].double() - v0.double()
        acc = x0 + sum((n / total) * (b * (s[k].double() - x0) + (1 - b) * dt) for s, b, n in zip(sources, betas, n_sources))
        out[k] = acc.to(v0.dtype)
    return out


@pytest.mark.parametrize("small, block", [(1 << 12, 1 << 18), (0, 7), (0, 1000), (3000, 64)])
def test_whole_and_blocked_kernels_agree_with_the_formulas(monkeypatch, small, block):
    """Entries are processed whole (≤ _SMALL values) or in blocks of _BLOCK values; every
    split, including a partial last block, gives the DESIGN formula."""
    monkeypatch.setattr(projection, "_SMALL", small)
    monkeypatch.setattr(projection, "_BLOCK", block)
    theta0 = {**tiny_state(4), "big.weight": torch.randn(50, 50, generator=torch.Generator().manual_seed(1))}
    target = perturbed(theta0, 11)
    sources = [perturbed(theta0, 12 + i) for i in range(3)]
    betas = [0.2, 0.6, 1.0]
    assert_close(A.gp(theta0, target, sources, beta=0.4, **SCALES),
                 gp_reference(theta0, target, sources, betas=[0.4] * 3, **SCALES), rtol=1e-5, atol=1e-6)
    assert_close(A.fedgp(theta0, target, sources, betas=betas, **SCALES),
                 gp_reference(theta0, target, sources, betas=betas, **SCALES), rtol=1e-5, atol=1e-6)
    assert_close(A.fedda(theta0, target, sources, betas=betas, n_sources=[3, 1, 2]),
                 fedda_reference(theta0, target, sources, betas=betas, n_sources=[3, 1, 2]), rtol=1e-5, atol=1e-6)
    cos = A.projection_cosines(theta0, target, sources)["big.weight"]
    d_t = (target["big.weight"] - theta0["big.weight"]).double().ravel()
    expected = [float(torch.nn.functional.cosine_similarity(d_t, (s["big.weight"] - theta0["big.weight"]).double().ravel(), dim=0)) for s in sources]
    assert cos == pytest.approx(expected, rel=1e-5)


def test_gp_hand_case_orthogonal_source_is_dropped():
    theta0 = {"w": t(0.0, 0.0)}
    target = {"w": t(1.0, 0.0)}
    orthogonal = {"w": t(0.0, 1.0)}  # cosine exactly 0 → excluded (strict c > 0)
    aligned = {"w": t(2.0, 1.0)}  # cosine 2/√5
    out = A.gp(theta0, target, [orthogonal, aligned], n_sources=[1, 1], n_target=1, bs_source=1,
               bs_target=1, lr_source=1, lr_target=1, beta=0.5)
    # s_i = 1·1·(1/1)/(1/1)·(1/2) = 0.5;  θ = 0.5·0.5·(2/√5)·(2,1) + 0.5·(1,0)
    c = 2 / math.sqrt(5)
    torch.testing.assert_close(out["w"], t(0.5 + 0.25 * c * 2, 0.25 * c))
    # The orthogonal source's cosine is exactly 0, so it is not among the kept (c > 0) ones.
    cosines = A.projection_cosines(theta0, target, [orthogonal, aligned])["w"]
    assert cosines[0] == 0.0 and cosines[1] == pytest.approx(c)
    assert [x > 0 for x in cosines] == [False, True]
    # ... and the result equals GP over the aligned source alone (Σn kept the same).
    alone = A.gp(theta0, target, [aligned], n_sources=[2], n_target=1, bs_source=1, bs_target=1,
                 lr_source=1, lr_target=1, beta=0.5)
    torch.testing.assert_close(out["w"], alone["w"])


def test_gp_negative_cosine_source_is_dropped():
    theta0 = {"w": t(1.0, 1.0)}
    target = {"w": t(2.0, 1.0)}
    opposed = {"w": t(-5.0, 3.0)}
    out = A.gp(theta0, target, [opposed], beta=0.5, **unit_scales(1))
    torch.testing.assert_close(out["w"], t(1.5, 1.0))  # θ0 + 0.5·Δ_T only


def test_zero_updates_give_cosine_zero_and_no_nan():
    theta0 = {"w": t(1.0, 2.0), "v": t(3.0)}
    target = {"w": t(2.0, 2.0), "v": t(3.0)}  # Δ_T = 0 on entry v
    silent = {"w": t(1.0, 2.0), "v": t(4.0)}  # Δ_i = 0 on entry w
    out = A.gp(theta0, target, [silent], beta=0.5, **unit_scales(1))
    assert all(torch.isfinite(v).all() for v in out.values())
    # w: the zero source is dropped; v: Δ_T = 0 makes every cosine 0, so v stays at θ0.
    torch.testing.assert_close(out["w"], t(1.5, 2.0))
    torch.testing.assert_close(out["v"], t(3.0))
    assert A.projection_cosines(theta0, target, [silent]) == {"w": [0.0], "v": [0.0]}
    out32 = A.gp({"w": torch.zeros(3)}, {"w": torch.zeros(3)}, [{"w": torch.zeros(3)}], **unit_scales(1))
    assert torch.equal(out32["w"], torch.zeros(3))


def test_cosines_are_per_entry_and_bn_running_stats_take_part():
    theta0 = {"conv.weight": t(0.0, 0.0), "bn.running_mean": t(0.0, 0.0), "bn.num_batches_tracked": torch.tensor(4)}
    target = {"conv.weight": t(1.0, 0.0), "bn.running_mean": t(0.0, 1.0), "bn.num_batches_tracked": torch.tensor(9)}
    # Aligned with the target on running_mean, opposed on conv.weight.
    source = {"conv.weight": t(-1.0, 0.0), "bn.running_mean": t(0.0, 3.0), "bn.num_batches_tracked": torch.tensor(99)}
    out = A.gp(theta0, target, [source], beta=0.5, **unit_scales(1))
    torch.testing.assert_close(out["conv.weight"], t(0.5, 0.0))  # source dropped here
    torch.testing.assert_close(out["bn.running_mean"], t(0.0, 0.5 + 0.5 * 1.0 * 3.0))  # kept, cos = 1
    assert out["bn.num_batches_tracked"].dtype == torch.long and int(out["bn.num_batches_tracked"]) == 4


def test_integer_entries_with_dimensions_keep_theta0():
    theta0 = {"w": t(0.0), "counts": torch.tensor([1, 2])}
    target = {"w": t(1.0), "counts": torch.tensor([5, 5])}
    out = A.gp(theta0, target, [clone(target)], beta=0.5, **unit_scales(1))
    assert torch.equal(out["counts"], torch.tensor([1, 2]))


def test_gp_source_scale_cancels_n_i():
    theta0 = {"w": t(0.0, 0.0)}
    target = {"w": t(1.0, 0.2)}
    sources = [{"w": t(1.0, 1.0)}, {"w": t(2.0, -0.5)}]
    kw = dict(n_target=10, bs_source=4, bs_target=2, lr_source=0.1, lr_target=0.05, epochs_source=2, epochs_target=1, beta=0.7)
    a = A.gp(theta0, target, sources, n_sources=[10, 30], **kw)
    b = A.gp(theta0, target, sources, n_sources=[20, 20], **kw)  # n_i changed, Σn the same
    torch.testing.assert_close(a["w"], b["w"])
    # Halving Σn doubles the scale: s = (0.05/0.1)·(1/2)·(10/2)·4/Σn = 5/Σn.
    c = A.gp(theta0, target, sources, n_sources=[10, 10], **kw)
    cos = [float(torch.nn.functional.cosine_similarity(target["w"], s["w"], dim=0)) for s in sources]
    for out, total in ((a, 40), (c, 20)):
        expected = 0.3 * target["w"] + sum(0.7 * (5 / total) * ci * s["w"] for ci, s in zip(cos, sources))
        torch.testing.assert_close(out["w"], expected)


def test_gp_beta_weights_the_sources():
    theta0 = tiny_state(3)
    target = perturbed(theta0, 1)
    sources = [perturbed(theta0, 2 + i) for i in range(3)]
    only_target = A.gp(theta0, target, sources, beta=0.0, **SCALES)
    expected = {k: (target[k] if v.is_floating_point() and v.dim() else v) for k, v in theta0.items()}
    assert_close(only_target, expected)  # β = 0: θ0 + Δ_T
    only_sources = A.gp(theta0, target, sources, beta=1.0, **SCALES)
    ref = gp_reference(theta0, target, sources, betas=[1.0] * 3, **SCALES)
    assert_close(only_sources, ref, rtol=1e-5, atol=1e-6)
    # β = 1 and no positive cosine → θ0 exactly.
    opposed = {k: (2 * theta0[k] - target[k] if v.is_floating_point() else v) for k, v in theta0.items()}
    assert_close(A.gp(theta0, target, [opposed], beta=1.0, **unit_scales(1)), theta0)


def test_fedgp_with_all_betas_zero_is_theta0_plus_target_update():
    theta0 = {"w": t(1.0, 1.0)}
    target = {"w": t(3.0, 0.0)}
    sources = [{"w": t(5.0, 5.0)}, {"w": t(0.0, 9.0)}, {"w": t(4.0, 0.0)}]
    out = A.fedgp(theta0, target, sources, betas=[0, 0, 0], n_sources=[1, 5, 2], n_target=3,
                  bs_source=2, bs_target=1, lr_source=1, lr_target=1)
    torch.testing.assert_close(out["w"], t(3.0, 0.0))


def test_fedgp_hand_case_target_term_weighted_by_sample_share():
    theta0 = {"w": t(0.0, 0.0)}
    target = {"w": t(2.0, 0.0)}
    sources = [{"w": t(1.0, 1.0)}, {"w": t(-1.0, 0.0)}]  # cos 1/√2, and −1 (dropped)
    out = A.fedgp(theta0, target, sources, betas=[0.5, 0.25], n_sources=[1, 3], n_target=2,
                  bs_source=1, bs_target=1, lr_source=1, lr_target=1)
    # s = (2/1)·1/Σn = 0.5 for both; target coefficient (1−0.5)·1/4 + (1−0.25)·3/4 = 0.6875
    expected = 0.6875 * t(2.0, 0.0) + 0.5 * 0.5 * (1 / math.sqrt(2)) * t(1.0, 1.0)
    torch.testing.assert_close(out["w"], expected)


@pytest.mark.parametrize("beta", [0.0, 0.35, 1.0])
def test_fedgp_with_equal_betas_equals_gp(beta):
    theta0 = tiny_state(5)
    target = perturbed(theta0, 6)
    sources = [perturbed(theta0, 7 + i) for i in range(3)]
    assert_close(A.fedgp(theta0, target, sources, betas=[beta] * 3, **SCALES),
                 A.gp(theta0, target, sources, beta=beta, **SCALES), rtol=1e-6, atol=1e-7)


def test_fedda_hand_case_has_no_projection():
    theta0 = {"w": t(1.0, 1.0), "n": torch.tensor(2)}
    target = {"w": t(2.0, 1.0), "n": torch.tensor(5)}
    sources = [{"w": t(1.0, 3.0), "n": torch.tensor(5)}, {"w": t(-1.0, 1.0), "n": torch.tensor(5)}]
    inputs = [clone(s) for s in (theta0, target, *sources)]
    out = A.fedda(theta0, target, sources, betas=[0.5, 0.2], n_sources=[1, 3])
    # Δ_T = (1,0); Δ_0 = (0,2); Δ_1 = (−2,0) (opposed to Δ_T, still used: FedDA does not project)
    # θ0 + ¼(0.5·(0,2) + 0.5·(1,0)) + ¾(0.2·(−2,0) + 0.8·(1,0)) = (1,1) + (0.125, 0.25) + (0.3, 0)
    torch.testing.assert_close(out["w"], t(1.425, 1.25))
    assert int(out["n"]) == 2
    for original, now in zip(inputs, (theta0, target, *sources)):
        assert_same(original, now)
    # β_i = 0: the target's model; β_i = 1: the sample-weighted source average.
    torch.testing.assert_close(A.fedda(theta0, target, sources, betas=[0, 0], n_sources=[1, 3])["w"], target["w"])
    torch.testing.assert_close(A.fedda(theta0, target, sources, betas=[1, 1], n_sources=[1, 3])["w"], t(-0.5, 1.5))


@pytest.mark.parametrize("small, block", [(1 << 12, 1 << 18), (0, 3)])
def test_rules_keep_low_precision_dtypes_and_compute_in_float32(monkeypatch, small, block):
    monkeypatch.setattr(projection, "_SMALL", small)
    monkeypatch.setattr(projection, "_BLOCK", block)
    theta0 = {"w": torch.zeros(4, dtype=torch.float16)}
    target = {"w": torch.full((4,), 0.5, dtype=torch.float16)}
    source = {"w": torch.full((4,), 0.25, dtype=torch.float16)}
    for out in (A.gp(theta0, target, [source], **unit_scales(1)),
                A.fedgp(theta0, target, [source], betas=[0.5], **unit_scales(1)),
                A.fedda(theta0, target, [source], betas=[0.5], n_sources=[1])):
        assert out["w"].dtype == torch.float16
    torch.testing.assert_close(A.gp(theta0, target, [source], **unit_scales(1))["w"],
                               torch.full((4,), 0.375, dtype=torch.float16))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s0, tg, sr: A.gp(s0, tg, sr, beta=1.5, **unit_scales(1)), "beta must lie in"),
        (lambda s0, tg, sr: A.gp(s0, tg, [], **unit_scales(1)), "no source updates"),
        (lambda s0, tg, sr: A.gp(s0, tg, sr, **unit_scales(2)), "1 sources but 2"),
        (lambda s0, tg, sr: A.gp(s0, tg, sr, **{**unit_scales(1), "n_sources": [0]}), r"n_sources\[0\]"),
        (lambda s0, tg, sr: A.gp(s0, tg, sr, **{**unit_scales(1), "lr_source": 0}), "lr_source"),
        (lambda s0, tg, sr: A.gp(s0, {"w": t(1.0)}, sr, **unit_scales(1)), "target: entry 'w' has shape"),
        (lambda s0, tg, sr: A.gp(s0, tg, [{"x": t(1.0, 2.0)}], **unit_scales(1)), "source 0: missing entries: 'w'"),
        (lambda s0, tg, sr: A.fedgp(s0, tg, sr, betas=[0.1, 0.2], **unit_scales(1)), "1 sources but 2 betas"),
        (lambda s0, tg, sr: A.fedgp(s0, tg, sr, betas=[-0.1], **unit_scales(1)), r"betas\[0\]"),
        (lambda s0, tg, sr: A.fedda(s0, tg, sr, betas=[0.5], n_sources=[0]), "positive sum"),
    ],
)
def test_gp_family_rejects_bad_arguments(call, message):
    theta0, target, source = {"w": t(0.0, 0.0)}, {"w": t(1.0, 0.0)}, {"w": t(1.0, 1.0)}
    with pytest.raises(ValueError, match=message):
        call(theta0, target, [source])


def _gp_case():
    theta0 = {"w": t(0.0, 0.0, 0.0)}
    target = {"w": t(1.0, 0.0, 0.0)}
    sources = [{"w": t(1.0, 1.0, 0.0)}, {"w": t(2.0, 0.0, 1.0)}]
    return theta0, target, sources


def test_gp_scale_from_step_counts_equals_the_epoch_formula_for_whole_epochs():
    """n_T=40, bs_T=10, E_T=2 → 8 target steps; n_i=60/30, bs_S=10, E_S=1 → 6/3 source steps."""
    theta0, target, sources = _gp_case()
    common = dict(n_sources=[60, 30], n_target=40, bs_source=10, bs_target=10, lr_source=1e-3, lr_target=2e-4)
    by_epochs = A.gp(theta0, target, sources, epochs_source=1, epochs_target=2, **common)
    by_steps = A.gp(theta0, target, sources, steps_source=[6, 3], steps_target=8, **common)
    assert_close(by_epochs, by_steps, rtol=1e-12, atol=1e-12)
    fedgp_e = A.fedgp(theta0, target, sources, betas=[0.2, 0.7], epochs_source=1, epochs_target=2, **common)
    fedgp_s = A.fedgp(theta0, target, sources, betas=[0.2, 0.7], steps_source=[6, 3], steps_target=8, **common)
    assert_close(fedgp_e, fedgp_s, rtol=1e-12, atol=1e-12)


def test_a_target_taking_more_steps_scales_the_sources_up_in_proportion():
    """`target_train.steps` = 3× the steps of one epoch: the source part grows 3×, the epoch formula did not see it."""
    theta0, target, sources = _gp_case()
    common = dict(n_sources=[60, 30], n_target=40, bs_source=10, bs_target=10, lr_source=1e-3, lr_target=2e-4,
                  beta=1.0)
    one = A.gp(theta0, target, sources, steps_source=[6, 3], steps_target=4, **common)["w"]
    three = A.gp(theta0, target, sources, steps_source=[6, 3], steps_target=12, **common)["w"]
    assert torch.allclose(three, 3 * one)
    assert not torch.allclose(A.gp(theta0, target, sources, **common)["w"], three)


@pytest.mark.parametrize("n_sources", [[1, 1, 1], [7, 3, 11], [0.1, 0.2, 0.3]])
def test_beta_zero_returns_the_target_bit_for_bit(n_sources):
    """FedDA/FedGP with every β_i = 0 are Target_Only: the target's floating entries, exactly."""
    g = torch.Generator().manual_seed(3)
    f64 = torch.float64  # float32 would hide a coefficient of 1 − 1e-16
    theta0 = {"w": torch.randn(50, generator=g, dtype=f64), "big": torch.randn(5000, generator=g, dtype=f64)}
    target = {k: v + 0.37 * torch.randn(v.shape, generator=g, dtype=f64) for k, v in theta0.items()}
    sources = [{k: v + torch.randn(v.shape, generator=g, dtype=f64) for k, v in theta0.items()} for _ in n_sources]
    scale = dict(n_target=10, bs_source=2, bs_target=2, lr_source=1e-3, lr_target=1e-4)
    for got in (A.fedda(theta0, target, sources, betas=[0.0] * 3, n_sources=n_sources),
                A.fedgp(theta0, target, sources, betas=[0.0] * 3, n_sources=n_sources, **scale),
                A.gp(theta0, target, sources, beta=0.0, n_sources=n_sources, **scale)):
        assert all(torch.equal(got[k], target[k]) for k in target)
