"""Counted nouns in what fedcxr prints and reports: "1 patient", "2 patients" (never "1 patients").

A leaf (no fedcxr import): the commands' console lines and the evaluation's report.md use it alike.
"""

from __future__ import annotations

#: nouns whose plural is not noun + "s"
IRREGULAR = {"reply": "replies", "class": "classes", "analysis": "analyses"}


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in the number it needs: ``count(1, "image")`` → ``"1 image"``."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {plural or IRREGULAR.get(noun, noun + 's')}"
