"""Text from outside fedcxr, made safe for the format it is written into (one module, every writer).

Site names, method names, file names and reasons reach fedcxr's outputs from exports, run
directories and other sites' replies, all of them hostile input (SECURITY.md "Reports").
Every writer passes such text through the function for its format:

* :func:`csv_cell` / :func:`csv_frame` — spreadsheet formula injection (the OWASP "CSV
  injection" rule): a text cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
  return (or their full-width forms, after leading spaces) is prefixed with a single quote, so
  Excel and LibreOffice show it as text instead of running it (``=HYPERLINK(...)``). Numbers are
  never touched; column names are cells too.
* :func:`md` — text inside Markdown (table cells, headings, list items): no raw HTML (a ``<``
  that would open a tag or comment becomes ``&lt;``, an ``&`` that would start an entity
  ``&amp;``; ``p<0.001`` stays as written), no table break (``|`` escaped), no new block (line breaks become
  spaces, so no injected ``##`` heading), no link, image or code span (``[``, ``]``, backtick
  escaped: an image link would make a viewer fetch a remote URL), no math (``$`` escaped);
  other control characters are shown as ``\\xNN``.
* :func:`md_text` — the same for prose (a paragraph, a list item, a heading), where ``|``
  breaks nothing and is left as written; a value that would open a block where it stands (a
  leading ``#``, ``>``, ``-``, ``+``, ``*``, ``=``, ``~`` or ``1.``) gets that one character escaped.
* :func:`code` — text inside an inline code span: nothing inside needs escaping (a code span
  shows backslashes as they are), so the span's fence is made longer than any run of backticks
  in the text; in a table cell (``cell=True``) ``|`` is still escaped, as GFM tables require.
  Only what the context needs is escaped: a reader of the raw file sees ``hospital_a``, not
  ``hospital\_a`` (emphasis characters are left: at worst a name shows in italics).
* :func:`short` — a bounded ``repr`` for error messages: at most ``limit`` characters, and
  :mod:`reprlib` walks only a few items and levels, so a YAML alias bomb is never expanded
  while its message is formatted.

Plots do not escape: :mod:`fedcxr.evaluation.plots` draws with matplotlib's mathtext turned off
(``text.parse_math``), so a ``$`` in a site name is a dollar sign, not a formula to parse.
"""

from __future__ import annotations

import reprlib
import re
from typing import Any

#: first characters a spreadsheet reads as a formula (OWASP), ASCII and full-width
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
_MD_CHARS = str.maketrans({"\\": "\\\\", "|": "\\|", "[": "\\[", "]": "\\]", "`": "\\`", "$": "\\$"})
#: what starts raw HTML (a tag, comment, declaration, processing instruction) or a character reference
_HTML = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?[A-Za-z0-9]+;)")
_LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")
_CONTROL = re.compile("[\x00-\x08\x0e-\x1b\x1f\x7f]")
#: default bound of :func:`short` (characters)
SHORT = 80


def csv_cell(value: Any) -> Any:
    """``value`` with a leading ``'`` when it is text a spreadsheet would run as a formula."""
    if isinstance(value, str) and value.lstrip(" ").startswith(FORMULA_START):
        return "'" + value
    return value


def csv_frame(frame):
    """A copy of a pandas frame whose text cells and column names pass :func:`csv_cell`."""
    out = frame.copy()
    for i in range(out.shape[1]):  # by position: column names may repeat
        column = out.iloc[:, i]
        if column.dtype == object or str(column.dtype) in ("string", "str"):
            out.isetitem(i, column.map(csv_cell, na_action="ignore"))
    out.columns = [csv_cell(c) for c in out.columns]
    return out


def to_csv_text(frame, **kwargs) -> str:
    """``frame.to_csv(index=False, **kwargs)`` after :func:`csv_frame`: what every CSV writer calls."""
    kwargs.setdefault("index", False)
    return csv_frame(frame).to_csv(**kwargs)


def md(value: Any) -> str:
    """``str(value)`` as literal Markdown text (see the module doc); ``None`` becomes ``""``."""
    if value is None:
        return ""
    text = _LINE_BREAKS.sub(" ", str(value)).translate(_MD_CHARS)
    text = _HTML.sub(lambda m: "&lt;" if m.group() == "<" else "&amp;", text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


_MD_TEXT_CHARS = {k: v for k, v in _MD_CHARS.items() if k != ord("|")}
#: what opens a block at the start of a line: ATX heading, quote, list item, setext underline, code
#: fence (``~~~``; a backtick is always escaped), ordered item
_BLOCK_START = re.compile(r"^(?:[#>+*=~-]|\d{1,9}(?=[.)]))")


def md_text(value: Any) -> str:
    """``str(value)`` as literal Markdown prose (module doc): :func:`md` without the table's ``\\|``."""
    if value is None:
        return ""
    text = _LINE_BREAKS.sub(" ", str(value)).translate(_MD_TEXT_CHARS)
    text = _HTML.sub(lambda m: "&lt;" if m.group() == "<" else "&amp;", text)
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    found = _BLOCK_START.match(text)
    if found:
        end = found.end()
        text = (text[:end] + "\\" + text[end:]) if found.group()[0].isdigit() else "\\" + text
    return text


def code(value: Any, *, cell: bool = False) -> str:
    """``str(value)`` as an inline code span (module doc); ``cell``: inside a GFM table cell."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", _LINE_BREAKS.sub(" ", "" if value is None else str(value)))
    if cell:
        text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or (text.startswith(" ") and text.endswith(" ")
                                                                   and text.strip()) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = SHORT, SHORT, 40


def short(value: Any, limit: int = SHORT) -> str:
    """A ``repr`` of ``value`` bounded to about ``limit`` characters, however large ``value`` is."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


__all__ = ["FORMULA_START", "SHORT", "code", "csv_cell", "csv_frame", "md", "md_text", "short", "to_csv_text"]
