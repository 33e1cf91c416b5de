"""YAML files from users (experiment configs, csv mappings): read within bounds, never a traceback.

A config is hostile input like any export (SECURITY.md R7). :func:`read_yaml` refuses, with a
:class:`~fedcxr.errors.UserError` (exit code 2) naming the file:

* a missing or special file (only a regular file is read), or one over :data:`MAX_BYTES`;
* text that is not UTF-8 (naming the byte and line);
* invalid YAML (PyYAML's message, bounded), nesting deeper than Python can walk;
* YAML aliases that expand past :data:`MAX_VALUES` values (an "alias bomb": 1 KB that reads as
  10⁹ values, which the first ``repr`` or validation pass would expand until memory runs out),
  and recursive aliases (:func:`check_size`, also used on ``--set`` values).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fedcxr.errors import UserError

#: what a YAML file may hold: its size on disk, and its values once aliases are expanded
MAX_BYTES = 1 << 20
MAX_VALUES = 100_000


def read_yaml(path: Path | str, what: str = "config file") -> Any:
    """The YAML content of ``path`` (see the module doc for what is refused); empty file → ``{}``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: {what} not found")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise UserError(f"{path}: {size:,} bytes; a {what} is at most {MAX_BYTES:,} bytes")
    raw = path.read_bytes()[:MAX_BYTES + 1]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}, line {line}: {raw[exc.start:exc.start + 1]!r}); "
                        f"save the {what} as UTF-8") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {str(exc)[:500]}") from None
    except RecursionError:
        raise UserError(f"{path}: the YAML is nested too deeply") from None
    check_size(data, f"{path}: ")
    return data


def check_size(data: Any, where: str = "") -> None:
    """Refuse YAML data whose values, with every alias expanded, number more than
    :data:`MAX_VALUES`, or that refers to itself. Counts shared nodes once per use without
    expanding them (memoised by identity), so a bomb is measured in microseconds."""
    counted: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in counted:
            return counted[key]
        if key in open_nodes:
            raise UserError(f"{where}the YAML refers to itself (a recursive alias)")
        open_nodes.add(key)
        items = [x for pair in node.items() for x in pair] if isinstance(node, dict) else node
        total = 1 + sum(size(item) for item in items)
        open_nodes.discard(key)
        if total > MAX_VALUES:
            raise UserError(f"{where}it holds more than {MAX_VALUES:,} values once its YAML aliases "
                            "are expanded (an alias bomb?); write it out without aliases")
        counted[key] = total
        return total

    try:
        size(data)
    except RecursionError:
        raise UserError(f"{where}the YAML is nested too deeply") from None


__all__ = ["MAX_BYTES", "MAX_VALUES", "check_size", "read_yaml"]
