"""Which cells of one group are hidden so that no small count can be worked out from what is sent.

A group's cells partition its rows and its total is known to whoever reads the payload (it is
sent, and every row group of a site has the same total: the site's row count). Hiding each cell
below K (*primary* suppression) is therefore not enough: with one hidden cell, total − the
others gives it back; with hidden cells that must all be K − 1 to reach the total (PA 4, AP 4,
LATERAL 4 beside unknown 5 in a 17-row site at K = 5: the three hidden cells sum to 12, each
is at most 4), every one is exact. Statistical disclosure control's answer is *secondary*
(complementary) suppression, as τ-ARGUS applies it to frequency tables: hide more cells until
every hidden cell has more than one value consistent with everything released.

:func:`protect` does that for one group of cells ``v`` (total ``T``, threshold ``K``):

1. ``T < K``: every cell and the total are hidden.
2. Primary: every cell ``< K`` is hidden (zeros too: a zero is not sent as a number either).
3. The primary cells, ``h`` of them summing to ``R``, are enough on their own when ``R == 0``
   (only zeros are hidden: an attacker may learn that a category is empty, which is not a
   small count of patients) or when ``h ≥ 2`` and ``R < h·(K − 1)``: then every vector of
   ``h`` values in ``[0, K − 1]`` summing to ``R`` gives the same release, and each cell takes
   at least two of those values.
4. Otherwise (one non-zero small cell, or small cells all at ``K − 1``) the smallest shown
   cell is hidden as well, **together with every shown cell of the same value**. The hidden
   cells now hold values below K and at least one value ≥ K, so they are not all equal; any
   permutation of them among their positions is released identically (the rule looks at
   values only, ties are hidden together, the cells still shown are all larger), so each
   hidden cell has at least two possible values.
5. When no shown cell is left (every cell is ``K − 1``: ``[4, 4, 4]`` at K = 5), the total is
   hidden too (:data:`STUCK`): the caller decides what that means for the rest of the site
   (:mod:`fedcxr.stats.release`: the site's row count is known from its other groups, so
   such a site sends nothing).

The guarantee is tested exhaustively (``tests/stats/test_suppression.py``): for every group of
2, 3 and 4 cells up to small totals and several K, every count vector that gives the same
release is enumerated, and no hidden non-zero cell has a single possible value — against an
attacker who knows this rule, the total and every cell shown. The limit: "more than one value"
is all that is promised — a hidden cell may be narrowed to two neighbouring values; and
groups that share rows (the age/sex pyramid and its margins, the acquisition groups) are
checked together afterwards by :mod:`fedcxr.stats.linked`.
"""

from __future__ import annotations

from typing import Sequence

#: ``protect``'s second value when even hiding every cell leaves them exact (see step 5).
STUCK = "stuck"


def protect(cells: Sequence[int], min_count: int) -> tuple[list[bool], bool | str]:
    """``(hidden, total_shown)`` for one group: which cells are hidden, and whether the total
    is sent (``True``), hidden because it is below K (``False``) or because the group cannot be
    protected otherwise (:data:`STUCK`). See the module docstring for the rule and its proof."""
    values = [int(v) for v in cells]
    k = int(min_count)
    if sum(values) < k:
        return [True] * len(values), False
    hidden = [v < k for v in values]
    small = [v for v, h in zip(values, hidden) if h]
    if not small or sum(small) == 0 or (len(small) >= 2 and sum(small) < len(small) * (k - 1)):
        return hidden, True
    shown = [v for v, h in zip(values, hidden) if not h]
    if not shown:
        return hidden, STUCK
    smallest = min(shown)
    return [h or v == smallest for v, h in zip(values, hidden)], True


def hide_below(cells: Sequence[int], min_count: int) -> list[bool]:
    """Primary suppression only (the cells below K): the cells whose values are sensitive."""
    return [int(v) < int(min_count) for v in cells]


__all__ = ["STUCK", "hide_below", "protect"]
