"""One config error as a line a user can act on: the key path, the problem, and the nearest known name.

pydantic says ``roudns: Extra inputs are not permitted``; the line adds ``(did you mean
`rounds`?)`` from the keys that are valid *at that place* — a mistyped ``source.lrr`` is
compared with ``source``'s keys, not the top level's — and, for a value outside a fixed set
(``model.backbone: resnet19``), the nearest allowed value (:mod:`fedcxr.suggest`). Keys and
values are user input: shown bounded.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from fedcxr.suggest import did_you_mean, known_keys


def error_line(err: dict, model: type[BaseModel]) -> str:
    """One pydantic error of ``model`` as ``key.path: message (did you mean …?)``."""
    message = str(err["msg"]).removeprefix("Value error, ")[:1000]
    loc = tuple(err.get("loc") or ())
    where = ".".join(str(p)[:60] for p in loc[:8])  # a key is user input too: bounded
    if err.get("type") == "extra_forbidden" and loc:
        message += did_you_mean(loc[-1], known_keys(model, loc[:-1]))
    elif err.get("type") == "literal_error":
        expected = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        message += did_you_mean(err.get("input"), expected)
    return f"{where}: {message}" if where else message


__all__ = ["error_line"]
