"""fedcxr.atomic: the one json_safe every JSON writer goes through, and json_bytes' key order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcxr.atomic import atomic_write_json, json_bytes, json_safe


def test_json_safe_turns_undefined_numbers_into_null_and_numpy_into_plain_values():
    value = {"b": [np.float32(0.5), np.nan, float("inf"), -np.inf], "a": (np.int64(3), np.bool_(True), True),
             1: {"na": pd.NA, "none": None, "path": Path("x/y.png"), "text": "ok"}}
    assert json_safe(value) == {"b": [0.5, None, None, None], "a": [3, True, True],
                                "1": {"na": None, "none": None, "path": "x/y.png", "text": "ok"}}
    out = json_safe(value)
    assert list(out) == ["b", "a", "1"]  # key order kept
    assert type(out["a"][0]) is int and type(out["a"][1]) is bool and type(out["b"][0]) is float


def test_json_safe_leaves_unknown_types_for_json_to_name():
    marker = object()
    assert json_safe([marker])[0] is marker
    with pytest.raises(TypeError, match="object"):
        json.dumps(json_safe({"x": marker}))


def test_json_bytes_is_strict_json_sorted_by_default_or_in_the_payloads_order(tmp_path):
    payload = {"z": float("nan"), "a": 1}
    assert json_bytes(payload) == b'{\n  "a": 1,\n  "z": null\n}\n'
    assert json_bytes(payload, sort_keys=False) == b'{\n  "z": null,\n  "a": 1\n}\n'
    atomic_write_json(tmp_path / "out.json", payload)
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1, "z": None}
