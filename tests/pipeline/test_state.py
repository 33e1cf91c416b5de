"""State-dict plumbing (fedcxr.pipeline.state): the one flatten, deltas, dict surgery, update checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcxr.models.network import CXRNet
from fedcxr.pipeline import state as S


def t(*values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def assert_close(a, b, **tol):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        torch.testing.assert_close(a[k], b[k], **tol)


def tiny_state(seed):
    """A conv + BN + linear state dict with running stats and num_batches_tracked."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 2))
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    state["1.num_batches_tracked"] = torch.tensor(seed, dtype=torch.long)
    return state


def perturbed(state, seed, size=0.1):
    gen = torch.Generator().manual_seed(seed)
    return {k: (v + size * torch.randn(v.shape, generator=gen, dtype=v.dtype) if v.is_floating_point() else v + 7)
            for k, v in state.items()}


def test_flatten_leaves_out_zero_dim_entries_of_a_real_model():
    state = CXRNet(["edema", "pneumonia"], backbone="resnet_tiny", hidden=8).state_dict()
    keys = S.update_keys(state)
    assert keys and all(state[k].dim() > 0 for k in keys)
    assert not any(k.endswith("num_batches_tracked") for k in keys)
    flat, spec = S.flatten_state(state)
    assert flat.numel() == spec.numel == sum(state[k].numel() for k in keys)


def test_cpu_state_is_a_detached_copy():
    model = nn.Linear(2, 1)
    copy = S.cpu_state(model)
    copy["weight"].add_(1.0)
    assert not torch.equal(copy["weight"], model.weight) and not copy["weight"].requires_grad


def test_flatten_and_unflatten_round_trip():
    state = tiny_state(2)
    state["half"] = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    flat, spec = S.flatten_state(state)
    assert flat.dtype == torch.float32 and flat.dim() == 1
    assert list(spec.keys) == [k for k, v in state.items() if v.dim() > 0]
    assert flat.numel() == spec.numel == sum(state[k].numel() for k in spec.keys)
    back = S.unflatten(flat, spec)
    assert_close(back, {k: state[k] for k in spec.keys})
    assert back["half"].dtype == torch.float16
    back["0.weight"].add_(1)  # fresh tensors: the flat vector is untouched
    torch.testing.assert_close(S.unflatten(flat, spec)["0.weight"], state["0.weight"])
    only, spec2 = S.flatten_state(state, keys=["3.bias", "0.bias"])
    torch.testing.assert_close(only, torch.cat([state["3.bias"], state["0.bias"]]))
    with pytest.raises(ValueError, match="expected a vector of"):
        S.unflatten(only[:-1], spec2)
    with pytest.raises(ValueError, match="unknown entries"):
        S.flatten_state(state, keys=["nope"])
    f64, _ = S.flatten_state({"a": t(1.0, 2.0)})
    assert f64.dtype == torch.float64


def test_delta_and_apply_delta_round_trip():
    theta0 = tiny_state(1)
    later = perturbed(theta0, 9)
    d = S.delta(later, theta0)
    assert int(d["1.num_batches_tracked"]) == 7
    assert_close(S.apply_delta(theta0, d), later, rtol=1e-6, atol=1e-6)
    half = S.apply_delta(theta0, d, scale=0.5)
    torch.testing.assert_close(half["0.weight"], (theta0["0.weight"] + later["0.weight"]) / 2)
    assert int(half["1.num_batches_tracked"]) == round(1 + 3.5)  # round-half-to-even: 4
    with pytest.raises(ValueError, match="missing entries"):
        S.apply_delta(theta0, {"0.weight": d["0.weight"]})


def test_split_merge_and_keep_keys():
    state = {"a": t(1.0), "bn.w": t(2.0), "b": t(3.0)}
    chosen, rest = S.split_state(state, ["bn.w"])
    assert list(chosen) == ["bn.w"] and list(rest) == ["a", "b"]
    assert chosen["bn.w"] is state["bn.w"]  # shallow, documented
    merged = S.merge_states(rest, chosen, {"b": t(9.0)})
    assert list(merged) == ["a", "b", "bn.w"] and float(merged["b"]) == 9.0
    with pytest.raises(ValueError, match="unknown entries"):
        S.split_state(state, ["zz"])
    initial = {"a": t(0.0), "bn.w": t(-1.0), "b": t(0.0)}
    kept = S.keep_keys(rest, initial, ["bn.w"])  # FedBN+: BN statistics from the initial model
    assert list(kept) == ["a", "bn.w", "b"]
    assert float(kept["bn.w"]) == -1.0 and float(kept["a"]) == 1.0
    kept["bn.w"].add_(5)
    assert float(initial["bn.w"]) == -1.0  # copied, not shared
    with pytest.raises(ValueError, match="not in the reference"):
        S.keep_keys(state, initial, ["zz"])
    with pytest.raises(ValueError, match="has shape"):
        S.keep_keys({"bn.w": t(1.0, 2.0)}, initial, ["bn.w"])


def test_check_update_reports_each_problem():
    ref = {"w": torch.zeros(2, 2), "n": torch.tensor(0)}
    assert S.check_update({"w": torch.ones(2, 2), "n": torch.tensor(3)}, ref) is None
    nan = S.check_update({"w": torch.tensor([[0.0, float("nan")], [0.0, 0.0]]), "n": torch.tensor(0)}, ref)
    assert "'w'" in nan and "1 NaN" in nan
    inf = S.check_update({"w": torch.tensor([[0.0, float("-inf")], [float("inf"), 0.0]]), "n": torch.tensor(0)}, ref)
    assert "2 infinite" in inf and "NaN" not in inf
    assert "shape (3,)" in S.check_update({"w": torch.zeros(3), "n": torch.tensor(0)}, ref)
    assert "missing entries: 'n'" in S.check_update({"w": torch.zeros(2, 2)}, ref)
    assert "unexpected entries: 'x'" in S.check_update({**ref, "x": torch.zeros(1)}, ref)
    assert "dtype" in S.check_update({"w": torch.zeros(2, 2, dtype=torch.long), "n": torch.tensor(0)}, ref)
    assert "not a tensor" in S.check_update({"w": [[0.0]], "n": torch.tensor(0)}, ref)
