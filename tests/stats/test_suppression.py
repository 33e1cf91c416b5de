"""Secondary suppression of one group, searched exhaustively: no hidden small count can be worked out.

The attacker knows the rule (``fedcxr.stats.suppression.protect``), the released cells and the
released total. For every count vector of small groups, every other vector that gives exactly
the same release is enumerated; a hidden cell whose value is the same in all of them is
recovered. Only a hidden zero may be recovered (an empty category is not a small count).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterator

import numpy as np
import pytest

from fedcxr.stats.release import release, release_group
from fedcxr.stats.site import SiteCounts
from fedcxr.stats.suppression import STUCK, protect

MIN_COUNTS = (1, 2, 3, 5, 7)
#: cells per group → largest total enumerated (every vector of that many cells up to it)
SIZES = {2: 40, 3: 30, 4: 24}


def vectors(n: int, total: int) -> Iterator[tuple[int, ...]]:
    """Every vector of ``n`` non-negative counts summing to ``total``."""
    if n == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in vectors(n - 1, total - first):
            yield (first, *rest)


def recovered(n: int, k: int, *, total_known: bool) -> list[tuple]:
    """``(release, cell, value)`` for every hidden non-zero cell that only one vector explains.

    ``total_known``: the attacker also has the true total when the group did not send it (a site's
    row groups all share its row count)."""
    explains: dict[tuple, list[tuple[int, ...]]] = defaultdict(list)
    for total in range(SIZES[n] + 1):
        for cells in vectors(n, total):
            sent = release_group(np.array(cells), k)
            key = (tuple(sent["counts"]), sent["count"] if sent["count"] is not None or not total_known else total)
            explains[key].append(cells)
    found = []
    for key, candidates in explains.items():
        for i, value in enumerate(key[0]):
            if value is None:
                values = {c[i] for c in candidates}
                if len(values) == 1 and values != {0}:
                    found.append((key, i, values.pop()))
    return found


@pytest.mark.parametrize("n", sorted(SIZES))
@pytest.mark.parametrize("k", MIN_COUNTS)
def test_no_hidden_cell_is_recovered_from_the_released_cells_and_total(n, k):
    assert recovered(n, k, total_known=False) == []


@pytest.mark.parametrize("n", sorted(SIZES))
@pytest.mark.parametrize("k", MIN_COUNTS)
def test_with_the_row_count_known_only_a_group_marked_stuck_gives_cells_away(n, k):
    for (cells, total), i, value in recovered(n, k, total_known=True):
        vector = tuple(value if c is None else c for c in cells)  # every cell hidden here: the values found
        assert protect(vector, k)[1] == STUCK, (cells, total, i, value)


def test_a_stuck_group_is_every_cell_at_k_minus_1():
    assert protect([4, 4, 4], 5) == ([True, True, True], STUCK)
    assert protect([4, 4, 3], 5)[1] is True and protect([4, 5, 4], 5)[1] is True


def site(**groups) -> SiteCounts:
    return SiteCounts(site="a", groups={k: np.array(v, dtype=np.int64) for k, v in groups.items()}, image_size=4,
                      class_set=["pneumonia"])


def test_the_issue_site_no_longer_gives_its_views_away():
    # 17 rows, view PA 4, AP 4, LATERAL 4, unknown 5 at K = 5: hiding the three 4s alone sent
    # [null, null, null, 5] and the total 17, so each hidden view had to be (17 − 5) / 3 = 4
    view = release(site(split=[17, 0, 0], view=[4, 4, 4, 5]), min_count=5)["groups"]["view"]
    assert view == {"count": 17, "counts": [None, None, None, None]}


def test_a_site_with_a_group_that_cannot_be_protected_sends_only_its_status():
    payload = release(site(split=[4, 4, 4], view=[6, 6, 0, 0]), min_count=5)  # 12 rows, each split 4
    assert payload["status"] == "suppressed" and payload["groups"] == {}
    assert "recoverable" in payload["message"]


def test_ties_are_hidden_together_so_position_gives_nothing_away():
    # the smallest shown cell is 5 twice: hiding only the first would tell which one was hidden
    assert protect([5, 5, 4, 30], 5) == ([True, True, True, False], True)
