"""US 3-digit ZIP prefix → state, for MIDRC's ``zip`` field (``--site-by state``).

MIDRC publishes only the first three ZIP digits of a case's residence, and ``000`` where that
area has fewer than 20,000 people. The table below is the USPS assignment of prefixes to
states as contiguous ranges (postal abbreviations; DC, Puerto Rico ``PR``, Virgin Islands
``VI``, Guam and the Pacific territories ``GU``, and the military ``AA``/``AE``/``AP``
prefixes included). Unassigned prefixes inside a range resolve to that range's state (they
carry no mail, so no case has them); the gaps between ranges (000–004, 269, 428–429, 529,
568, 578–579, 589, 659, 694–699, 715, 817–819, 839, 848–849, 866–869, 886–888, 899) and
``000`` (MIDRC's "small population") are unknown.

The papers' MIDRC sites are US states, so this coarse table is all the partition needs;
it is not an address geocoder.
"""

from __future__ import annotations

import bisect
import re
from typing import Optional

#: (first prefix, last prefix, state), sorted and disjoint.
ZIP3_RANGES: tuple[tuple[int, int, str], ...] = (
    (5, 5, "NY"), (6, 7, "PR"), (8, 8, "VI"), (9, 9, "PR"),
    (10, 27, "MA"), (28, 29, "RI"), (30, 38, "NH"), (39, 49, "ME"),
    (50, 54, "VT"), (55, 55, "MA"), (56, 59, "VT"), (60, 69, "CT"), (70, 89, "NJ"), (90, 99, "AE"),
    (100, 149, "NY"), (150, 196, "PA"), (197, 199, "DE"),
    (200, 200, "DC"), (201, 201, "VA"), (202, 205, "DC"), (206, 219, "MD"), (220, 246, "VA"),
    (247, 268, "WV"), (270, 289, "NC"), (290, 299, "SC"),
    (300, 319, "GA"), (320, 339, "FL"), (340, 340, "AA"), (341, 349, "FL"),
    (350, 369, "AL"), (370, 385, "TN"), (386, 397, "MS"), (398, 399, "GA"),
    (400, 427, "KY"), (430, 459, "OH"), (460, 479, "IN"), (480, 499, "MI"),
    (500, 528, "IA"), (530, 549, "WI"), (550, 567, "MN"), (569, 569, "DC"),
    (570, 577, "SD"), (580, 588, "ND"), (590, 599, "MT"),
    (600, 629, "IL"), (630, 658, "MO"), (660, 679, "KS"), (680, 693, "NE"),
    (700, 714, "LA"), (716, 729, "AR"), (730, 732, "OK"), (733, 733, "TX"), (734, 749, "OK"),
    (750, 799, "TX"), (800, 816, "CO"), (820, 831, "WY"), (832, 838, "ID"), (840, 847, "UT"),
    (850, 865, "AZ"), (870, 884, "NM"), (885, 885, "TX"), (889, 898, "NV"),
    (900, 961, "CA"), (962, 966, "AP"), (967, 968, "HI"), (969, 969, "GU"),
    (970, 979, "OR"), (980, 994, "WA"), (995, 999, "AK"),
)
_STARTS = [lo for lo, _, _ in ZIP3_RANGES]


def zip3_prefix(value: object) -> Optional[str]:
    """Normalise a ZIP value to its 3-digit prefix, or ``None``.

    ``'606'``/``606`` → ``'606'``; ``60``/``'60'``/``60.0`` → ``'060'`` (MIDRC's dictionary types
    ``zip`` as an integer, so leading zeros may be lost); a 5-digit ZIP or ZIP+4 → its first
    three digits (``2115`` is read as ``02115``). Blank, non-numeric or longer values → ``None``.
    """
    if value is None:
        return None
    if isinstance(value, float):
        if value != value or value != int(value):
            return None
        value = int(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+\.0+", text):
        text = text.split(".")[0]
    text = text.split("-")[0] if re.fullmatch(r"\d{5}-\d{4}", text) else text
    if not text.isdigit():
        return None
    if len(text) <= 3:
        return text.zfill(3)
    if len(text) <= 5:
        return text.zfill(5)[:3]
    if len(text) == 9:
        return text[:3]
    return None


def zip3_state(value: object) -> Optional[str]:
    """State (postal code) of a ZIP prefix; ``None`` for ``000``, unassigned or unparseable."""
    prefix = zip3_prefix(value)
    if prefix is None or prefix == "000":
        return None
    number = int(prefix)
    i = bisect.bisect_right(_STARTS, number) - 1
    if i < 0:
        return None
    lo, hi, state = ZIP3_RANGES[i]
    return state if lo <= number <= hi else None


__all__ = ["ZIP3_RANGES", "zip3_prefix", "zip3_state"]
