"""Surgical aggregation of heads (fedcxr.pipeline.aggregate.surgical): rows matched by class name."""

from __future__ import annotations

import pytest
import torch

from fedcxr.pipeline import aggregate as A

from .states import assert_same, clone, t


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
