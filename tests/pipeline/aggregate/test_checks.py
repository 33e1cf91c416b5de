"""The argument checks the rule families share (fedcxr.pipeline.aggregate.checks): a hyper-parameter that
is not a positive number, or a weight outside [0, 1], is refused by name before any arithmetic."""

from __future__ import annotations

import math

import pytest

from fedcxr.pipeline.aggregate.checks import _positive, _unit_interval


def test_a_positive_number_is_finite_and_above_zero():
    assert _positive("lr", 2) == 2.0 and isinstance(_positive("lr", 2), float)
    for bad in (0, -1e-9, math.inf, math.nan):
        with pytest.raises(ValueError, match=f"lr must be a positive number, got {bad}"):
            _positive("lr", bad)


def test_a_weight_lies_in_the_closed_unit_interval():
    assert [_unit_interval("beta", v) for v in (0, 0.25, 1)] == [0.0, 0.25, 1.0]
    for bad in (-0.01, 1.01, math.nan):
        with pytest.raises(ValueError, match=f"beta must lie in \\[0, 1\\], got {bad}"):
            _unit_interval("beta", bad)
