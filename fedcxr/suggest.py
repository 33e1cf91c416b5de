""""Did you mean …?" for a mistyped name: config keys, method, site and class names, command-line choices.

One rule everywhere (a leaf: the standard library, and pydantic for :func:`known_keys`): the
known names whose :class:`difflib.SequenceMatcher` ratio with the typed one is at least
:data:`CUTOFF`, compared case-insensitively, so ``FedAvg_FineTune`` finds ``FedAvg_Finetune``
and ``roudns`` finds ``rounds``. A name that differs only in case is the one suggestion; else
the closest, with any other exactly as close. The typed name is user input: it is never echoed
by this module (the caller shows it, bounded)."""

from __future__ import annotations

import difflib
import typing
from typing import Any, Iterable, Optional

from pydantic import AliasChoices, BaseModel

#: how alike a name must be to be suggested (difflib's ratio; its own default)
CUTOFF = 0.6


def close_matches(word: object, choices: Iterable[object], n: int = 2) -> list[str]:
    """The known names closest to ``word`` (at most ``n``, best first); [] when none is close."""
    if not isinstance(word, str) or not word or len(word) > 200:
        return []
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(str(choice).lower(), str(choice))
    key = word.lower()
    if key in by_lower:  # only the case differs: that name, and no other guess
        return [by_lower[key]] if by_lower[key] != word else []
    scored = sorted((-difflib.SequenceMatcher(None, key, low).ratio(), by_lower[low]) for low in by_lower)
    return [name for score, name in scored if -score >= CUTOFF][:n]


def did_you_mean(word: object, choices: Iterable[object], n: int = 3) -> str:
    """``" (did you mean `rounds`?)"``, or ``""`` when nothing is close: the closest name, with the
    others exactly as close (``hospital_c`` → ``hospital_a`` or ``hospital_b``), at most ``n``."""
    choices = list(choices)
    found = close_matches(word, choices, n)
    if not found:
        return ""
    key = str(word).lower()
    best = difflib.SequenceMatcher(None, key, found[0].lower()).ratio()
    found = [m for m in found if difflib.SequenceMatcher(None, key, m.lower()).ratio() == best]
    return " (did you mean " + " or ".join(f"`{m}`" for m in found) + "?)"


def known_keys(model: type[BaseModel], path: Iterable[Any]) -> list[str]:
    """The keys (field names and their aliases) of the pydantic-checked YAML section at ``path``
    ([] if unknown): what a mistyped key there is compared with.

    ``path`` is pydantic's location: field names, and list indices, dict keys or union members'
    names between them, which leave the section's model unchanged.
    """
    models: list = [model]
    for part in path:
        fields = [f for f in (_field(m, part) for m in models) if f is not None]
        if fields:
            models = [m for f in fields for m in _models_in(f.annotation)]
            if not models:
                return []  # a plain mapping or value: its keys are not the config's to know
        elif isinstance(part, str) and any(m.__name__ == part for m in models):
            models = [m for m in models if m.__name__ == part]
    return sorted({key for m in models for key in _keys(m)})


def _field(model: type[BaseModel], key: Any) -> Optional[Any]:
    for name, field in model.model_fields.items():
        if key == name or key in _aliases(field):
            return field
    return None


def _keys(model: type[BaseModel]) -> set[str]:
    return {k for name, field in model.model_fields.items() for k in (name, *_aliases(field))}


def _aliases(field: Any) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str)]
    return [a for a in (alias, field.alias) if isinstance(a, str)]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models inside a field's type (``Optional[X]``, ``list[X]``, ``dict[str, X]``...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


__all__ = ["CUTOFF", "close_matches", "did_you_mean", "known_keys"]
