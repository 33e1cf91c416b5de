"""README's commands run as written after `bash install.sh`: one convention for where `fedcxr` comes from.

A new user ran `bash install.sh`, then the README's `fedcxr init mystudy`, and got
`fedcxr: command not found` (the first block said `.venv/bin/fedcxr`, later ones `fedcxr`). The
README now activates the environment once, in its first block, and every command after it is
the bare name.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _command_lines() -> list[tuple[int, str]]:
    """``(line number, command)`` of every line in a fenced ``bash`` block or an indented code block."""
    found, fenced = [], False
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = line.strip() == "```bash"
            continue
        if fenced or line.startswith("    ") and line.strip():
            command = line.split("#", 1)[0].strip()
            if command:
                found.append((number, command))
    return found


def test_the_first_block_activates_the_environment_before_any_fedcxr_command():
    lines = _command_lines()
    first_activation = next(n for n, c in lines if "source .venv/bin/activate" in c)
    first_fedcxr = next(n for n, c in lines if re.search(r"(^|&& )fedcxr\b", c))
    assert first_activation <= first_fedcxr
    text = README.read_text()
    assert text.index("source .venv/bin/activate") < text.index("## Your own data in three steps")


def test_every_command_is_the_bare_name_after_the_activation():
    mixed = [f"README.md:{n}: {c}" for n, c in _command_lines() if re.search(r"\.venv/bin/(fedcxr|tensorboard)\b", c)]
    assert not mixed, "commands after `source .venv/bin/activate` use the bare name:\n" + "\n".join(mixed)
