"""One config error as a line a user can act on: the key path, the problem, and the nearest known name.

pydantic says ``roudns: Extra inputs are not permitted``; the line adds ``(did you mean
`rounds`?)`` from the keys that are valid *at that place* — a mistyped ``source.lrr`` is
compared with ``source``'s keys, not the top level's — and, for a value outside a fixed set
(``model.backbone: resnet19``), the nearest allowed value (:mod:`fedcxr.suggest`). Keys and
values are user input: shown bounded.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

from pydantic import BaseModel

from fedcxr.suggest import did_you_mean, known_keys


def error_line(err: dict, model: type[BaseModel], sections: Optional[Mapping[str, type[BaseModel]]] = None) -> str:
    """One pydantic error of ``model`` as ``key.path: message (did you mean …?)``.

    ``sections``: top-level keys checked by a model of their own that is not one of ``model``'s fields
    (the methods' options blocks, ``fedprox: {mu: ...}``): a mistyped key inside one is compared with
    that block's keys, a mistyped top-level key with these keys too."""
    message = str(err["msg"]).removeprefix("Value error, ")[:1000]
    loc = tuple(err.get("loc") or ())
    where = ".".join(str(p)[:60] for p in loc[:8])  # a key is user input too: bounded
    if err.get("type") == "extra_forbidden" and loc:
        message += did_you_mean(loc[-1], _keys_at(model, loc[:-1], sections or {}))
    elif err.get("type") == "literal_error":
        expected = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        message += did_you_mean(err.get("input"), expected)
    return f"{where}: {message}" if where else message


def _keys_at(model: type[BaseModel], path: tuple, sections: Mapping[str, type[BaseModel]]) -> list[str]:
    """The keys valid at ``path``: a section's own, or the model's (and, at the top, the sections')."""
    if path and path[0] in sections:
        return known_keys(sections[path[0]], path[1:])
    return known_keys(model, path) + ([] if path else sorted(sections))


__all__ = ["error_line"]
