"""FedAvg, FedBN and the streaming average (fedcxr.pipeline.aggregate.mean): hand-computed cases."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from fedcxr.pipeline import aggregate as A

from .states import assert_close, assert_same, clone, t, tiny_state


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



def _held(avg: A.StreamingAverage) -> tuple[int, int]:
    """(tensors, bytes) the accumulator holds: its running sums (the meta references have no storage)."""
    sums = list(avg._sum.values())
    return len(sums), sum(v.numel() * v.element_size() for v in sums)


@pytest.mark.parametrize("local_keys", [(), ("1.running_mean", "1.running_var")])
def test_streaming_memory_does_not_grow_with_the_number_of_sites(local_keys):
    """FedAvg/FedBN over 5 and over 100 sites hold the same buffers, and at most one reply at a time.

    The mean rule's side of issue 31 item 4: replies fed as they come are added and dropped, so the
    rule's memory is one model (+ the reply being added) at any N."""
    held, alive_at_yield = {}, {}
    seeds = [tiny_state(i) for i in range(7)]
    for n in (5, 100):
        refs, alive = [], []

        def replies():
            for i in range(n):
                alive.append(sum(r() is not None for r in refs))  # earlier replies still referenced
                reply = clone(seeds[i % 7])
                refs.append(weakref.ref(reply["0.weight"]))
                yield reply, 1 + i % 3
                del reply  # this generator's own reference (a transport's receive loop drops it too)

        avg = A.StreamingAverage(exclude=local_keys)
        for state, weight in replies():
            avg.add(state, weight)
            del state
        held[n], alive_at_yield[n] = _held(avg), max(alive)
        assert avg.count == n
        gc.collect()
        assert all(r() is None for r in refs)
        states = [seeds[i % 7] for i in range(n)]
        assert_close(A.fedavg_streaming(((clone(s), 1 + i % 3) for i, s in enumerate(states)), local_keys),
                     A.fedbn(states, [1 + i % 3 for i in range(n)], local_keys))
    assert held[5] == held[100] and held[5][0] == len(tiny_state(0)) - len(local_keys)
    assert alive_at_yield == {5: 0, 100: 0}

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


class _Calls(torch.overrides.TorchFunctionMode):
    """The names of the torch functions and tensor methods called inside it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_a_reply_is_added_in_one_foreach_call_with_the_per_entry_floats():
    """Issue 31 item 4: each reply's entries are added to the running sum in one ``_foreach_add_``
    (float32 entries), not ~70 Python calls — the same sums bit for bit as entry-by-entry ``add_``,
    integer and float64 entries included."""
    g = torch.Generator().manual_seed(0)
    shapes = [(16, 3, 3, 3), (16,), (32, 16, 3, 3), (32,), (2, 32), (2,)] * 6
    states = []
    for i in range(7):
        state = {f"w{j}": torch.randn(s, generator=g) for j, s in enumerate(shapes)}
        state["d"] = torch.randn(4, generator=g, dtype=torch.float64)
        state["bn.num_batches_tracked"] = torch.tensor(10 + i)
        states.append(state)
    weights = [3.0, 17.0, 5.0, 11.0, 2.0, 7.0, 13.0]
    got = A.StreamingAverage()
    want_sum = {k: v.detach().to(torch.float64 if not v.is_floating_point() else v.dtype) * weights[0]
                for k, v in states[0].items()}
    for state, weight in zip(states, weights):
        if got.count:
            for key, acc in want_sum.items():
                acc.add_(state[key].to(acc.dtype), alpha=weight)
        got.add(state, weight)
    assert all(torch.equal(got._sum[k], want_sum[k]) for k in want_sum)
    with _Calls() as calls:
        got.add(states[0], 1.0)
    assert calls.names.count("_foreach_add_") == 1 and calls.names.count("add_") == 1  # the integer entry
