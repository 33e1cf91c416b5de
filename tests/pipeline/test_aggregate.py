"""Aggregation rules (fedcxr.pipeline.aggregate): hand-computed cases for every edge case of
DESIGN §5, plus float64 numpy references written straight from the formulas."""

from __future__ import annotations

import gc
import math
import weakref

import numpy as np
import pytest
import torch
from torch import nn

from fedcxr.pipeline import aggregate as A
from fedcxr.pipeline import state as S

# --------------------------------------------------------------------------- helpers


def clone(state):
    return {k: v.clone() for k, v in state.items()}


def assert_same(a, b):
    """Same keys, dtypes and exactly equal values."""
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def assert_close(a, b, **tol):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        torch.testing.assert_close(a[k], b[k], **tol)


def t(*values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def unit_scales(n):
    """GP keyword arguments giving every source scale s_i = (n_T/bs_T)·bs_S/Σn = 1 (Σn = 1)."""
    return dict(n_sources=[1.0 / n] * n, n_target=1, bs_source=1, bs_target=1, lr_source=1, lr_target=1)


def tiny_state(seed, scale=1.0):
    """A conv + BN + linear state dict with running stats and num_batches_tracked."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 2))
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    state["1.running_mean"] = torch.randn(3) * scale
    state["1.running_var"] = torch.rand(3) + 0.5
    state["1.num_batches_tracked"] = torch.tensor(seed, dtype=torch.long)
    return state


def perturbed(state, seed, size=0.1):
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in state.items():
        if v.is_floating_point():
            out[k] = v + size * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        else:
            out[k] = v + 7
    return out


# --------------------------------------------------------------------------- FedAvg / FedBN


def test_fedavg_normalises_sample_counts_and_averages_bn_statistics():
    a = {"w": t(1.0, 2.0), "bn.running_mean": t(0.0), "bn.running_var": t(4.0)}
    b = {"w": t(3.0, 6.0), "bn.running_mean": t(8.0), "bn.running_var": t(0.0)}
    out = A.fedavg([a, b], [10, 30])
    assert_close(out, {"w": t(2.5, 5.0), "bn.running_mean": t(6.0), "bn.running_var": t(1.0)})
    # Only the ratio of the counts matters.
    assert_close(A.fedavg([a, b], [1, 3]), out)


def test_fedavg_integer_entries_are_the_rounded_weighted_mean_in_their_dtype():
    a = {"n": torch.tensor(3), "w": t(0.0)}
    b = {"n": torch.tensor(6), "w": t(1.0)}
    out = A.fedavg([a, b], [1, 3])  # (3 + 18) / 4 = 5.25
    assert out["n"].dtype == torch.long and int(out["n"]) == 5
    assert int(A.fedavg([a, b], [3, 1])["n"]) == 4  # (9 + 6) / 4 = 3.75


def test_fedavg_keeps_dtypes_and_does_not_mutate_inputs():
    a = {"h": torch.tensor([1.0, 2.0], dtype=torch.float16), "d": t(1.0), "f": torch.tensor([1.0])}
    b = {"h": torch.tensor([3.0, 4.0], dtype=torch.float16), "d": t(2.0), "f": torch.tensor([2.0])}
    a0, b0 = clone(a), clone(b)
    out = A.fedavg([a, b], [1, 1])
    assert {k: v.dtype for k, v in out.items()} == {"h": torch.float16, "d": torch.float64, "f": torch.float32}
    assert_same(a, a0)
    assert_same(b, b0)
    out["f"].add_(100)  # the result is fresh memory, not a view of an input
    assert_same(a, a0)


def test_fedavg_single_state_is_returned_unchanged_as_a_copy():
    a = tiny_state(0)
    out = A.fedavg([a], [5])
    assert_close(out, a)
    assert all(out[k].data_ptr() != a[k].data_ptr() for k in a)


@pytest.mark.parametrize(
    "states, weights, message",
    [
        ([], [], "no states"),
        ([{"w": t(1.0)}], [1, 2], "1 states but 2 weights"),
        ([{"w": t(1.0)}, {"v": t(1.0)}], [1, 1], "missing entries: 'w'"),
        ([{"w": t(1.0)}, {"w": t(1.0), "x": t(2.0)}], [1, 1], "unexpected entries: 'x'"),
        ([{"w": t(1.0)}, {"w": t(1.0, 2.0)}], [1, 1], "entry 'w' has shape (2,)"),
        ([{"w": t(1.0)}], [-1], "weight must be finite and >= 0"),
        ([{"w": t(1.0)}, {"w": t(2.0)}], [0, 0], "all weights are zero"),
        ([{"w": t(1.0)}], [float("nan")], "finite"),
    ],
)
def test_fedavg_rejects_bad_input_with_a_clear_message(states, weights, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        A.fedavg(states, weights)


def test_zero_weight_site_contributes_nothing():
    out = A.fedavg([{"w": t(1.0)}, {"w": t(50.0)}], [2, 0])
    assert_close(out, {"w": t(1.0)})


def test_fedbn_leaves_local_keys_out_and_averages_the_rest():
    a, b = tiny_state(1), tiny_state(2)
    local = ["1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"]
    out = A.fedbn([a, b], [1, 1], local)
    assert set(out) == set(a) - set(local)
    assert list(out) == [k for k in a if k not in local]  # state-dict order kept
    for k in out:
        torch.testing.assert_close(out[k], (a[k] + b[k]) / 2)


def test_fedbn_rejects_unknown_local_keys():
    with pytest.raises(ValueError, match="bn.typo"):
        A.fedbn([tiny_state(1)], [1], ["bn.typo"])


def test_streaming_average_matches_fedavg_and_keeps_no_reply_alive():
    states = [tiny_state(s) for s in range(4)]
    weights = [3, 1, 4, 1]
    avg = A.StreamingAverage()
    refs = []
    for s, w in zip(states, weights):
        reply = clone(s)
        refs.append(weakref.ref(reply["0.weight"]))
        avg.add(reply, w)
        del reply
    gc.collect()
    # Memory flat in the number of sites: no added reply is retained by the accumulator.
    assert all(r() is None for r in refs)
    assert avg.count == 4 and avg.total_weight == 9
    assert_close(avg.result(), A.fedavg(states, weights))
    assert_close(A.fedavg_streaming((clone(s), w) for s, w in zip(states, weights)), A.fedavg(states, weights))


def test_streaming_average_exclude_result_and_errors():
    avg = A.StreamingAverage(exclude=["b"])
    with pytest.raises(ValueError, match="no state was added"):
        avg.result()
    avg.add({"a": t(1.0), "b": t(100.0)}, 1)
    avg.add({"a": t(3.0)}, 1)  # excluded entries may be absent from later replies
    assert_close(avg.result(), {"a": t(2.0)})
    assert_close(avg.result(), {"a": t(2.0)})  # result() does not consume the sum
    with pytest.raises(ValueError, match="state #3: entry 'a' has shape"):
        avg.add({"a": t(1.0, 2.0)}, 1)
    with pytest.raises(ValueError, match="not in the state"):
        A.StreamingAverage(exclude=["zz"]).add({"a": t(1.0)}, 1)


# --------------------------------------------------------------------------- surgical aggregation


def test_surgical_heads_match_rows_by_class_name_not_position():
    classes = ["a", "b", "c"]
    # Client 0 lists (a, b); client 1 lists (b, a): same names, opposite row order.
    h0 = {"weight": t(1.0, 1.0, 2.0, 2.0).reshape(2, 2), "bias": t(10.0, 20.0)}
    h1 = {"weight": t(4.0, 4.0, 3.0, 3.0).reshape(2, 2), "bias": t(40.0, 30.0)}
    # Client 2 has only c.
    h2 = {"weight": t(7.0, 8.0).reshape(1, 2), "bias": t(70.0)}
    inputs = [clone(h) for h in (h0, h1, h2)]
    glob, per_client = A.surgical_heads(inputs, [["a", "b"], ["b", "a"], ["c"]], classes)
    # a: rows (1,1) from client 0 and (3,3) from client 1 → (2,2); bias (10+30)/2.
    # b: (2,2) and (4,4) → (3,3); bias (20+40)/2. c: client 2 alone, unchanged.
    torch.testing.assert_close(glob["weight"], t(2.0, 2.0, 3.0, 3.0, 7.0, 8.0).reshape(3, 2))
    torch.testing.assert_close(glob["bias"], t(20.0, 30.0, 70.0))
    # Each client gets its own classes back, in its own order.
    torch.testing.assert_close(per_client[0]["weight"], t(2.0, 2.0, 3.0, 3.0).reshape(2, 2))
    torch.testing.assert_close(per_client[1]["weight"], t(3.0, 3.0, 2.0, 2.0).reshape(2, 2))
    torch.testing.assert_close(per_client[1]["bias"], t(30.0, 20.0))
    torch.testing.assert_close(per_client[2]["bias"], t(70.0))
    for h, h_in in zip((h0, h1, h2), inputs):
        assert_same(h, h_in)


def test_surgical_mean_is_unweighted_over_clients_having_the_class():
    classes = ["x", "y"]
    heads = [
        {"weight": t(0.0).reshape(1, 1), "bias": t(0.0)},
        {"weight": t(3.0).reshape(1, 1), "bias": t(3.0)},
        {"weight": t(6.0, 5.0).reshape(2, 1), "bias": t(6.0, 5.0)},
    ]
    glob, _ = A.surgical_heads(heads, [["x"], ["x"], ["x", "y"]], classes)
    torch.testing.assert_close(glob["weight"], t(3.0, 5.0).reshape(2, 1))  # (0+3+6)/3, 5/1
    torch.testing.assert_close(glob["bias"], t(3.0, 5.0))


def test_surgical_class_without_clients_keeps_previous_row_and_bias():
    classes = ["a", "orphan", "b"]
    previous = {"weight": t(9.0, 9.0, 8.0, 8.0, 7.0, 7.0).reshape(3, 2), "bias": t(-1.0, -2.0, -3.0)}
    heads = [{"weight": t(1.0, 2.0, 3.0, 4.0).reshape(2, 2), "bias": t(0.5, 0.25)}]
    glob, per_client = A.surgical_heads(heads, [["b", "a"]], classes, previous=previous)
    torch.testing.assert_close(glob["weight"], t(3.0, 4.0, 8.0, 8.0, 1.0, 2.0).reshape(3, 2))
    torch.testing.assert_close(glob["bias"], t(0.25, -2.0, 0.5))
    torch.testing.assert_close(per_client[0]["weight"], heads[0]["weight"])


def test_surgical_class_without_clients_and_no_previous_is_an_error_naming_it():
    heads = [{"weight": torch.zeros(1, 4), "bias": torch.zeros(1)}]
    with pytest.raises(ValueError, match=r"\['pneumonia'\]"):
        A.surgical_heads(heads, [["edema"]], ["edema", "pneumonia"])


def test_surgical_keeps_dtype():
    heads = [{"weight": torch.ones(2, 3, dtype=torch.float16), "bias": torch.ones(2, dtype=torch.float16)}]
    glob, per_client = A.surgical_heads(heads, [["a", "b"]], ["b", "a"])
    assert glob["weight"].dtype == torch.float16 and per_client[0]["bias"].dtype == torch.float16


@pytest.mark.parametrize(
    "heads, class_sets, classes, message",
    [
        ([{"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}], [["zz"]], ["a"], r"\['zz'\] not in the global"),
        ([{"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}], [["a"]], ["a"], "1 classes but head shapes"),
        ([{"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}], [["a", "a"]], ["a"], "lists a class twice"),
        ([{"weight": torch.zeros(1, 2)}], [["a"]], ["a"], "has no 'bias'"),
        (
            [{"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}, {"weight": torch.zeros(1, 3), "bias": torch.zeros(1)}],
            [["a"], ["a"]], ["a"], "feature size",
        ),
        ([{"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}], [["a"], ["a"]], ["a"], "1 heads but 2 class sets"),
    ],
)
def test_surgical_rejects_inconsistent_heads(heads, class_sets, classes, message):
    with pytest.raises(ValueError, match=message):
        A.surgical_heads(heads, class_sets, classes)


# --------------------------------------------------------------------------- GP: numpy reference


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
    monkeypatch.setattr(A, "_SMALL", small)
    monkeypatch.setattr(A, "_BLOCK", block)
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
    monkeypatch.setattr(A, "_SMALL", small)
    monkeypatch.setattr(A, "_BLOCK", block)
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


# --------------------------------------------------------------------------- auto-weighting


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


# --------------------------------------------------------------------------- helpers


def test_source_step_update_divides_by_the_number_of_batches():
    torch.testing.assert_close(A.source_step_update(torch.tensor([4.0, 8.0]), 4), torch.tensor([1.0, 2.0]))
    out = A.source_step_update({"w": t(3.0), "n": torch.tensor(6)}, 3)
    torch.testing.assert_close(out["w"], t(1.0))
    assert int(out["n"]) == 6
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="positive integer"):
            A.source_step_update(torch.ones(2), bad)


def test_idd_is_the_mean_absolute_difference_and_differentiable():
    a = torch.tensor([[0.2, 0.9], [0.5, 0.5]], requires_grad=True)
    b = torch.tensor([[0.4, 0.6], [0.5, 1.0]])
    value = A.idd(a, b)
    assert value.dim() == 0
    torch.testing.assert_close(value, torch.tensor(0.25))  # (0.2 + 0.3 + 0 + 0.5) / 4
    value.backward()
    torch.testing.assert_close(a.grad, torch.tensor([[-0.25, 0.25], [0.0, -0.25]]))
    assert float(A.idd(b, b)) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        A.idd(torch.zeros(2, 3), torch.zeros(3, 2))


# --------------------------------------------------------------------------- GP scale from real step counts


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


# --------------------------------------------------------------------------- robust rules (hand-computed)


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
