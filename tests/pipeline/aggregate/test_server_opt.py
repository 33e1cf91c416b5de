"""FedOpt and SCAFFOLD server rules (fedcxr.pipeline.aggregate.server_opt), against the published update
equations (Reddi et al. 2021, Algorithm 2; Karimireddy et al. 2020, Algorithm 1) on tiny tensors
whose results are worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from fedcxr.pipeline import aggregate as A


def t(*values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def model(w, bn_mean=0.0, steps=3):
    """A parameter ``w``, a BN running statistic and a 0-dim integer counter."""
    return {"w": t(*w), "bn.running_mean": t(bn_mean), "bn.num_batches_tracked": torch.tensor(steps)}


# --------------------------------------------------------------------------- FedOpt (Reddi et al. 2021, Alg. 2)


def test_fedadam_two_rounds_by_hand():
    """β = (0.5, 0.75), τ = 2 (v_{−1} = τ² = 4), η = 0.4, Δ_0 = 2 then Δ_1 = −2.

    Round 0: m = 0.5·0 + 0.5·2 = 1; v = 0.75·4 + 0.25·4 = 4; step = 0.4·1/(√4 + 2) = 0.1.
    Round 1: m = 0.5·1 + 0.5·(−2) = −0.5; v = 0.75·4 + 0.25·4 = 4; step = 0.4·(−0.5)/4 = −0.05.
    """
    theta = model([1.0])
    new, moments = A.fedopt(theta, model([3.0]), None, rule="adam", server_lr=0.4, betas=(0.5, 0.75), tau=2.0,
                            keys=["w"])
    assert float(new["w"]) == pytest.approx(1.1, abs=1e-12)
    assert float(moments["m"]["w"]) == 1.0 and float(moments["v"]["w"]) == 4.0
    again, moments = A.fedopt(new, model([1.1 - 2.0]), moments, rule="adam", server_lr=0.4, betas=(0.5, 0.75),
                              tau=2.0, keys=["w"])
    assert float(again["w"]) == pytest.approx(1.05, abs=1e-12)
    assert float(moments["m"]["w"]) == pytest.approx(-0.5) and float(moments["v"]["w"]) == pytest.approx(4.0)


def test_fedadagrad_accumulates_squared_updates():
    """β1 = 0 (m = Δ), τ = 0.5: v = 0.25 + 1.2² = 1.69, step = 0.3·1.2/(1.3 + 0.5) = 0.2;
    round 1 with Δ = 1.2 again: v = 1.69 + 1.44 = 3.13, step = 0.3·1.2/(√3.13 + 0.5)."""
    theta = {"w": t(0.0)}
    new, moments = A.fedopt(theta, {"w": t(1.2)}, None, rule="adagrad", server_lr=0.3, betas=(0.0, 0.99), tau=0.5)
    assert float(new["w"]) == pytest.approx(0.2, abs=1e-12) and float(moments["v"]["w"]) == pytest.approx(1.69)
    again, moments = A.fedopt(new, {"w": t(1.4)}, moments, rule="adagrad", server_lr=0.3, betas=(0.0, 0.99), tau=0.5)
    assert float(moments["v"]["w"]) == pytest.approx(3.13)
    assert float(again["w"]) == pytest.approx(0.2 + 0.3 * 1.2 / (math.sqrt(3.13) + 0.5), abs=1e-12)


def test_fedyogi_moves_v_additively_towards_the_squared_update_where_fedadam_mixes():
    """β2 = 0.75, v_{−1} = τ² = 4, Δ = (4, 1, 2): Δ² = (16, 1, 4).

    Yogi: v = v − 0.25·Δ²·sign(v − Δ²) = (4 + 4, 4 − 0.25, 4) = (8, 3.75, 4) (unchanged where Δ² = v);
    Adam: v = 0.75·4 + 0.25·Δ² = (7, 3.25, 4).
    """
    theta, average = {"w": t(0.0, 0.0, 0.0)}, {"w": t(4.0, 1.0, 2.0)}
    kwargs = dict(server_lr=0.1, betas=(0.9, 0.75), tau=2.0)
    _, yogi = A.fedopt(theta, average, None, rule="yogi", **kwargs)
    _, adam = A.fedopt(theta, average, None, rule="adam", **kwargs)
    assert yogi["v"]["w"].tolist() == [8.0, 3.75, 4.0]
    assert adam["v"]["w"].tolist() == [7.0, 3.25, 4.0]
    new, _ = A.fedopt(theta, average, None, rule="yogi", **kwargs)  # m = 0.1·Δ; step = 0.1·m/(√v + 2)
    expected = [0.1 * 0.1 * d / (math.sqrt(v) + 2.0) for d, v in zip((4.0, 1.0, 2.0), (8.0, 3.75, 4.0))]
    torch.testing.assert_close(new["w"], t(*expected))


def test_fedopt_averages_what_it_does_not_step_and_keeps_dtypes():
    """BN running statistics and the integer counter take the clients' mean (FedAvg), as NVFLARE's FedOpt."""
    theta = {"w": t(1.0, dtype=torch.float32), "bn.running_var": t(0.5, dtype=torch.float32),
             "bn.num_batches_tracked": torch.tensor(3)}
    average = {"w": t(2.0, dtype=torch.float32), "bn.running_var": t(0.25, dtype=torch.float32),
               "bn.num_batches_tracked": torch.tensor(7)}
    new, moments = A.fedopt(theta, average, None, rule="adam", server_lr=0.01, keys=["w"])
    assert float(new["bn.running_var"]) == 0.25 and int(new["bn.num_batches_tracked"]) == 7
    assert new["w"].dtype == torch.float32 and new["bn.num_batches_tracked"].dtype == torch.int64
    assert set(moments["m"]) == {"w"} and float(new["w"]) > 1.0
    # without keys every floating non-0-dim entry is stepped, BN statistics too (Flower's behaviour): the
    # protocols pass the trainable parameters
    default, moments = A.fedopt(theta, average, None, rule="adam", server_lr=0.01)
    assert set(moments["m"]) == {"w", "bn.running_var"} and float(default["bn.running_var"]) != 0.25


def test_fedopt_refuses_what_the_algorithm_does_not_define():
    theta = {"w": t(1.0, 2.0)}
    with pytest.raises(ValueError, match="rule"):
        A.fedopt(theta, theta, None, rule="sgdm", server_lr=0.1)
    with pytest.raises(ValueError, match=r"betas.*\[0, 1\)"):
        A.fedopt(theta, theta, None, rule="adam", server_lr=0.1, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="tau"):
        A.fedopt(theta, theta, None, rule="adam", server_lr=0.1, tau=0.0)
    with pytest.raises(ValueError, match="moments"):  # a checkpoint of another model
        A.fedopt(theta, theta, {"m": {"w": t(0.0)}, "v": {"w": t(1.0)}}, rule="adam", server_lr=0.1)
    with pytest.raises(ValueError, match="integer"):
        A.fedopt({"n": torch.tensor([1])}, {"n": torch.tensor([2])}, None, rule="adam", server_lr=0.1, keys=["n"])


# --------------------------------------------------------------------------- SCAFFOLD (Karimireddy et al. 2020, Alg. 1)


def test_scaffold_server_step_by_hand():
    """x = (1, 2), c = (0.1, −0.1); two of N = 4 clients answer with weights 1 and 3.

    average = (0.5, 3.5) (the caller's weighted mean of y_1 = (2, 2), y_2 = (0, 4));
    x ← x + 0.5·(average − x) = (0.75, 2.75);
    Σ w̄_i Δc_i = (1·(1, 0) + 3·(−1, 2))/4 = (−0.5, 1.5); c ← c + (2/4)·(−0.5, 1.5) = (−0.15, 0.65).
    """
    theta, control = model([1.0, 2.0], bn_mean=0.3), {"w": t(0.1, -0.1)}
    average = model([0.5, 3.5], bn_mean=0.9, steps=5)
    x, c = A.scaffold(theta, control, average, [{"w": t(1.0, 0.0)}, {"w": t(-1.0, 2.0)}], [1.0, 3.0],
                      server_lr=0.5, participation=0.5)
    torch.testing.assert_close(x["w"], t(0.75, 2.75))
    torch.testing.assert_close(c["w"], t(-0.15, 0.65))
    assert float(x["bn.running_mean"]) == 0.9 and int(x["bn.num_batches_tracked"]) == 5  # FedAvg'd
    assert float(theta["w"][0]) == 1.0 and float(control["w"][0]) == 0.1, "inputs are not mutated"


def test_scaffold_with_uniform_weights_is_algorithm_1_and_unit_step_is_the_mean():
    """Algorithm 1: x ← x + (η_g/|S|)·ΣΔy_i, c ← c + (1/N)·ΣΔc_i; with η_g = 1, x is the mean exactly."""
    theta, control = {"w": t(1.0, 1.0)}, {"w": t(0.0, 0.0)}
    ys = [t(3.0, 0.0), t(1.0, 2.0), t(2.0, 4.0)]
    dcs = [{"w": t(0.3, 0.0)}, {"w": t(0.0, 0.6)}, {"w": t(0.9, 0.3)}]
    average = {"w": sum(ys) / 3}
    x, c = A.scaffold(theta, control, average, dcs, [1.0, 1.0, 1.0], server_lr=1.0, participation=3 / 5)
    assert torch.equal(x["w"], average["w"])
    torch.testing.assert_close(c["w"], t((0.3 + 0.0 + 0.9) / 5, (0.0 + 0.6 + 0.3) / 5))
    x2, _ = A.scaffold(theta, control, average, dcs, [1.0, 1.0, 1.0], server_lr=2.0, participation=3 / 5)
    torch.testing.assert_close(x2["w"], theta["w"] + 2.0 * sum(y - theta["w"] for y in ys) / 3)


def test_scaffold_client_control_option_two_by_hand():
    """c_i = (0.2, 0), c = (0.1, 0.1), x = (1, 1), y_i = (0.8, 1.3), K = 4, η_l = 0.1:
    (x − y_i)/(Kη_l) = (0.5, −0.75); c_i⁺ = c_i − c + that = (0.6, −0.85); Δc_i = (0.4, −0.85)."""
    local, control = {"w": t(0.2, 0.0)}, {"w": t(0.1, 0.1)}
    new, delta = A.scaffold_client_control(local, control, {"w": t(1.0, 1.0)}, {"w": t(0.8, 1.3)}, steps=4, lr=0.1)
    torch.testing.assert_close(new["w"], t(0.6, -0.85))
    torch.testing.assert_close(delta["w"], t(0.4, -0.85))
    same, zero = A.scaffold_client_control(local, control, {"w": t(1.0, 1.0)}, {"w": t(1.0, 1.0)}, steps=0, lr=0.1)
    assert torch.equal(same["w"], local["w"]) and torch.equal(zero["w"], t(0.0, 0.0))


def test_scaffold_refuses_mismatched_inputs():
    theta, control = {"w": t(1.0, 2.0)}, {"w": t(0.0, 0.0)}
    with pytest.raises(ValueError, match="participation"):
        A.scaffold(theta, control, theta, [control], [1.0], participation=0.0)
    with pytest.raises(ValueError, match="control update 0"):
        A.scaffold(theta, control, theta, [{"w": t(1.0)}], [1.0])
    with pytest.raises(ValueError, match="weights"):
        A.scaffold(theta, control, theta, [control], [1.0, 2.0])
    with pytest.raises(ValueError, match="shape"):
        A.scaffold(theta, {"w": t(0.0)}, theta, [{"w": t(0.0)}], [1.0])
    with pytest.raises(ValueError, match="lacks"):
        A.scaffold_client_control({}, control, theta, theta, steps=1, lr=0.1)
