"""ZIP prefix → state table used by the MIDRC adapter's ``group__state``."""

from __future__ import annotations

import pytest

from fedcxr.site_adapters.zip3 import ZIP3_RANGES, zip3_prefix, zip3_state


@pytest.mark.parametrize("value, state", [
    ("606", "IL"), ("021", "MA"), ("100", "NY"), ("900", "CA"), ("770", "TX"), ("200", "DC"),
    ("201", "VA"), ("733", "TX"), ("885", "TX"), ("967", "HI"), ("995", "AK"), ("055", "MA"),
    ("006", "PR"), ("981", "WA"), ("303", "GA"), ("331", "FL"), ("452", "OH"), ("631", "MO"),
])
def test_known_prefixes(value, state):
    assert zip3_state(value) == state


@pytest.mark.parametrize("value, prefix", [
    (606, "606"), (60, "060"), ("60", "060"), (60.0, "060"), ("060.0", "060"), ("02115", "021"),
    (2115, "021"), ("02115-1234", "021"), ("000", "000"), ("", None), (None, None), ("abc", None),
    (float("nan"), None), ("1234567", None),
])
def test_prefix_normalisation(value, prefix):
    assert zip3_prefix(value) == prefix


@pytest.mark.parametrize("value", ["000", "001", "269", "899", "", None, "xyz"])
def test_unknown_prefixes(value):
    assert zip3_state(value) is None


def test_table_is_sorted_disjoint_and_covers_every_state():
    previous = -1
    for lo, hi, _ in ZIP3_RANGES:
        assert previous < lo <= hi <= 999
        previous = hi
    states = {s for _, _, s in ZIP3_RANGES}
    assert len(states - {"PR", "VI", "GU", "AA", "AE", "AP"}) == 51  # 50 states + DC
