"""Auto-weighted β_i (fedcxr.pipeline.aggregate.auto_weighting) against the FedGP paper's
estimators computed directly in float64 numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedcxr.pipeline import aggregate as A
from fedcxr.pipeline import state as S

from .states import perturbed, t, tiny_state


def auto_reference(g, s):
    """DESIGN §5 / FedGP App. A.5 estimators, literally, in float64 numpy."""
    g = g.double().numpy()
    s = s.double().numpy()
    b, m = g.shape
    gbar = g.mean(0)
    v = ((g - gbar) ** 2).sum() / (b - 1) / m
    sigma2 = v / b
    out = {"sigma2": sigma2, "d2": [], "tau2d2": [], "fedda": [], "fedgp": []}
    for si in s:
        d2 = max(np.mean([((gj - si) ** 2).sum() for gj in g]) / m - v, 0.0)
        norm = np.linalg.norm(si)
        u = si / norm if norm > 0 else np.zeros_like(si)
        p = g - np.outer(g @ u, u)
        pbar = p.mean(0)
        var_p = ((p - pbar) ** 2).sum() / (b - 1) / m
        tau2d2 = max(np.mean((p**2).sum(1)) / m - var_p, 0.0)
        out["d2"].append(d2)
        out["tau2d2"].append(tau2d2)
        for rule, dist in (("fedda", d2), ("fedgp", tau2d2)):
            out[rule].append(0.0 if norm == 0 or sigma2 + dist == 0 else sigma2 / (sigma2 + dist))
    return out


@pytest.mark.parametrize("seed, b, n, m", [(0, 6, 3, 50), (1, 2, 1, 7), (2, 12, 4, 300), (3, 3, 2, 250_000)])
def test_auto_betas_match_a_direct_computation(seed, b, n, m):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(b, m, generator=gen) * 0.5 + torch.randn(m, generator=gen)
    s = torch.randn(n, m, generator=gen) + 0.3 * g.mean(0)
    ref = auto_reference(g, s)
    g0, s0 = g.clone(), s.clone()
    for rule in ("fedda", "fedgp"):
        out = A.auto_betas(g, s, rule=rule)
        assert torch.equal(g, g0) and torch.equal(s, s0)
        assert set(out) == {"sigma2", "d2", "tau2d2", "betas"}
        assert out["sigma2"] == pytest.approx(ref["sigma2"], rel=1e-6)
        assert out["d2"] == pytest.approx(ref["d2"], rel=1e-6, abs=1e-12)
        assert out["tau2d2"] == pytest.approx(ref["tau2d2"], rel=1e-6, abs=1e-12)
        assert out["betas"] == pytest.approx(ref[rule], rel=1e-6, abs=1e-12)


def test_auto_betas_clip_distances_at_zero():
    g = torch.tensor([[1.0, 0.0, 2.0], [3.0, 2.0, 0.0], [2.0, 1.0, 1.0]], dtype=torch.float64)
    gbar = g.mean(0)
    # s = ḡ: mean_j‖g_j − s‖²/M − v = (B−1)/B·v − v < 0 → d² clipped to 0 → FedDA β = 1.
    # s = 2ḡ: every p̄ = 0, so mean‖p_j‖² − samplevar(p) < 0 → τ²d² clipped → FedGP β = 1.
    s = torch.stack([gbar, 2 * gbar])
    ref = auto_reference(g, s)
    unclipped = np.mean([((gj - gbar.numpy()) ** 2).sum() for gj in g.numpy()]) / 3 - ref["sigma2"] * 3
    assert unclipped < 0  # the case really exercises the clip
    out = A.auto_betas(g, s, rule="fedda")
    assert out["d2"][0] == 0.0 and out["betas"][0] == 1.0
    out = A.auto_betas(g, s, rule="fedgp")
    assert out["tau2d2"] == [0.0, 0.0] and out["betas"] == [1.0, 1.0]
    assert out["d2"][1] > 0


def test_auto_betas_zero_source_gets_beta_zero_and_no_nan():
    gen = torch.Generator().manual_seed(4)
    g = torch.randn(5, 40, generator=gen)
    s = torch.stack([torch.zeros(40), torch.randn(40, generator=gen)])
    for rule in ("fedda", "fedgp"):
        out = A.auto_betas(g, s, rule=rule)
        assert out["betas"][0] == 0.0 and out["betas"][1] > 0
        assert all(math.isfinite(x) for x in out["d2"] + out["tau2d2"] + out["betas"])
    # With the projection on a zero vector taken as 0, τ²d² equals d² for that source.
    assert out["tau2d2"][0] == pytest.approx(out["d2"][0])


def test_auto_betas_guard_zero_over_zero():
    g = torch.ones(4, 6)  # no target variance: σ² = 0
    out = A.auto_betas(g, torch.ones(1, 6), rule="fedda")  # and d² = 0
    assert out["sigma2"] == 0.0 and out["d2"] == [0.0] and out["betas"] == [0.0]
    assert A.auto_betas(g, torch.ones(1, 6), rule="fedgp")["betas"] == [0.0]


def test_auto_betas_float32_and_float64_inputs_agree():
    gen = torch.Generator().manual_seed(8)
    g = torch.randn(4, 1000, generator=gen)
    s = torch.randn(2, 1000, generator=gen)
    a = A.auto_betas(g, s)
    b = A.auto_betas(g.double(), s.double())
    assert a["betas"] == pytest.approx(b["betas"], rel=1e-6)


@pytest.mark.parametrize(
    "g, s, rule, message",
    [
        (torch.zeros(1, 3), torch.zeros(1, 3), "fedgp", "at least 2 target batch"),
        (torch.zeros(2, 3), torch.zeros(1, 4), "fedgp", r"\(B, M\) and \(N, M\)"),
        (torch.zeros(2, 3), torch.zeros(3), "fedgp", r"\(B, M\) and \(N, M\)"),
        (torch.zeros(2, 3), torch.zeros(1, 3), "fedavg", "rule must be"),
    ],
)
def test_auto_betas_rejects_bad_input(g, s, rule, message):
    with pytest.raises(ValueError, match=message):
        A.auto_betas(g, s, rule=rule)


def test_auto_betas_end_to_end_with_the_flattening_helpers():
    theta0 = tiny_state(0)
    batch_states = [perturbed(theta0, 50 + j, size=0.01) for j in range(4)]
    g = torch.stack([S.flatten_state(S.delta(b, theta0))[0] for b in batch_states])
    source = perturbed(theta0, 60, size=0.05)
    flat, spec = S.flatten_state(S.delta(source, theta0))
    s = A.source_step_update(flat, 5)
    assert g.shape == (4, spec.numel) and s.shape == (spec.numel,)
    assert "1.num_batches_tracked" not in spec.keys
    out = A.auto_betas(g, s.unsqueeze(0))
    assert 0.0 <= out["betas"][0] <= 1.0


def test_source_step_update_divides_by_the_number_of_batches():
    torch.testing.assert_close(A.source_step_update(torch.tensor([4.0, 8.0]), 4), torch.tensor([1.0, 2.0]))
    out = A.source_step_update({"w": t(3.0), "n": torch.tensor(6)}, 3)
    torch.testing.assert_close(out["w"], t(1.0))
    assert int(out["n"]) == 6
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="positive integer"):
            A.source_step_update(torch.ones(2), bad)
