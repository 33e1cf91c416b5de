"""Argument checks shared by the rule families (a positive number, a weight in [0, 1]).

Kept apart so that the projection rules and the server optimisers word a bad hyper-parameter the
same way without importing each other.
"""

from __future__ import annotations

import math


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value}")
    return value


def _unit_interval(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return value
