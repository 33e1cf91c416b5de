"""What a run's training refused and missed, for its evaluation report (issue 27 item 4).

A report that lists the training sites but not that one of them was refused in every round
reads as an honest consortium's result. :func:`training_record` summarises ``run.json``'s
``refused`` (replies the reply checks left out, ``defences:``), ``missed`` (sites that did not
answer) and ``refusal_pattern``, compactly — per site: how many replies, in which rounds, by
which check, with one reason as an example; per absent site, why (``disconnected``: FLARE lost its
client; ``no answer within N s``: the round's deadline passed) — and :func:`training_section`
writes it as the report's Markdown section. ``report.json`` keeps the rounds as ``run.json`` does
(the 0-based index); ``report.md`` numbers them as people count, from 1, as the console and
``train.log`` do (:func:`rounds_text`). The FLARE cross-site report gets the same section (both build their
header with :func:`fedcxr.evaluation.report.report_header`).

``run.json`` is read as hostile input like every run-directory file: entries of the wrong shape
are skipped and counted, text is bounded here and escaped where it is written
(:func:`fedcxr.escape.md`), and at most :data:`MAX_ENTRIES` entries are read.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from fedcxr.escape import md

#: entries of ``refused``/``missed`` read (a longer list is cut here and said so)
MAX_ENTRIES = 100_000
#: characters kept of a site name, a check name, an example reason
MAX_SITE, MAX_CHECK, MAX_REASON = 100, 40, 300
#: round ranges written per site before "…"
MAX_RANGES = 20
#: distinct reasons kept per absent site (the first ones met)
MAX_REASONS = 5
#: the reason of an absence ``run.json`` gives none for (a run written before reasons were kept)
NO_REPLY = "no reply"
#: what a reason of ``run.json`` ``missed`` means, said once under the table when one is met
#: (the reasons the FLARE transport records: :mod:`fedcxr.flare.liveness`)
REASON_NOTES = {
    "disconnected": ("disconnected", "the FLARE server had lost the site's client and did not ask it"),
    "no answer within": ("no answer within N s", "the round's deadline (`--timeout`) passed first"),
}


def training_record(run_info: Mapping[str, Any]) -> Optional[dict]:
    """``{"status", "refused": [...], "missed": [...], "pattern", "skipped"}`` from ``run.json``, or
    ``None`` when it records neither (a run directory written before the reply checks).

    ``refused``: per site ``{site, n, rounds, checks: {check: n}, reason}`` (the first reason);
    ``missed``: per site ``{site, n, rounds, why: {reason: n}}`` for replies that never came (the
    reason ``no reply`` where ``run.json`` gives none; a refused reply is also in ``run.json``'s
    ``missed``, marked ``rejected:``; it is counted under ``refused`` only);
    ``skipped``: entries that were not records of this shape, or past :data:`MAX_ENTRIES`."""
    if "refused" not in run_info and "missed" not in run_info:
        return None
    skipped = 0
    refused: dict[str, dict] = {}
    for entry in _entries(run_info.get("refused")):
        parsed = _parse(entry)
        if parsed is None:
            skipped += 1
            continue
        site, r = parsed
        row = refused.setdefault(site, {"site": site, "n": 0, "rounds": set(), "checks": {}, "reason": None})
        check = _text(entry.get("check"), MAX_CHECK) or "unknown"
        row["n"] += 1
        row["rounds"].add(r)
        row["checks"][check] = row["checks"].get(check, 0) + 1
        row["reason"] = row["reason"] or _text(entry.get("reason"), MAX_REASON)
    missed: dict[str, dict] = {}
    for entry in _entries(run_info.get("missed")):
        parsed = _parse(entry)
        if parsed is None:
            skipped += 1
            continue
        if str(entry.get("reason", "")).startswith("rejected:"):
            continue  # the refused list holds it, with its check
        site, r = parsed
        row = missed.setdefault(site, {"site": site, "n": 0, "rounds": set(), "why": {}})
        row["n"] += 1
        row["rounds"].add(r)
        why = _text(entry.get("reason"), MAX_REASON) or NO_REPLY
        if why in row["why"] or len(row["why"]) < MAX_REASONS:
            row["why"][why] = row["why"].get(why, 0) + 1
    skipped += sum(max(0, len(v) - MAX_ENTRIES) for v in (run_info.get("refused"), run_info.get("missed"))
                   if isinstance(v, list))
    finish = lambda rows: [{**row, "rounds": sorted(row["rounds"])} for row in rows.values()]  # noqa: E731
    pattern = run_info.get("refusal_pattern")
    return {"status": _text(run_info.get("status"), MAX_CHECK), "refused": finish(refused), "missed": finish(missed),
            "pattern": _pattern(pattern) if isinstance(pattern, Mapping) else None, "skipped": skipped}


def training_section(report: Mapping[str, Any]) -> list[str]:
    """The report's Markdown lines on refused and missed training replies ([] without a record)."""
    record = report.get("training")
    if not record:
        return []
    lines = ["## Training: refused and missed replies", ""]
    refused, missed = record["refused"], record["missed"]
    if not refused and not missed:
        return lines + ["Every site answered every training task and no reply was refused.", ""]
    if refused:
        total = sum(row["n"] for row in refused)
        lines += [f"The reply checks (`defences:`) refused {total} repl{'y' if total == 1 else 'ies'} of "
                  f"{len(refused)} site{'s' if len(refused) > 1 else ''}; a refused reply is left out of its round "
                  "(`run.json` `refused` has every reason).", ""]
        header = ["Site", "Refused", "Rounds", "Checks", "Reason (first)"]
        rows = [[row["site"], str(row["n"]), rounds_text(row["rounds"]),
                 ", ".join(f"{check} × {n}" for check, n in sorted(row["checks"].items())), row["reason"] or ""]
                for row in refused]
        lines += _table(header, rows) + [""]
    if missed:
        met = {why for row in missed for why in row["why"]}
        notes = [f"“{shown}”: {text}" for prefix, (shown, text) in REASON_NOTES.items()
                 if any(m.startswith(prefix) for m in met)]
        lines += ["Sites that sent no reply to some training tasks; each of those rounds went on without them"
                  + (f" ({'; '.join(notes)})" if notes else "") + ":", ""]
        lines += _table(["Site", "Missed", "Rounds", "Why"],
                        [[row["site"], str(row["n"]), rounds_text(row["rounds"]),
                          ", ".join(f"{why} × {n}" for why, n in row["why"].items())] for row in missed]) + [""]
    pattern = record.get("pattern")
    if pattern:
        lines += [f"Over {md(pattern['rounds'])} rounds, {md(', '.join(pattern['always_refused']))} had a reply "
                  f"refused in every round while {md(', '.join(pattern['never_refused']))} never did: a lone faulty "
                  "site, or — when the refused are the majority — a model taken over by the site that passes.", ""]
    if record.get("skipped"):
        lines += [f"{md(record['skipped'])} entries of `run.json` `refused`/`missed` were not readable records and "
                  "are not counted here.", ""]
    return lines


def rounds_text(rounds: list[int]) -> str:
    """``1–5, 8, 10–12``: the rounds as people count them (round 1 is the first) from the 0-based
    indices of ``run.json`` and ``metrics.jsonl`` (``[0, 1, 2, 3, 4, 7, 9, 10, 11]`` here)."""
    ranges: list[str] = []
    start = prev = None
    for r in (int(i) + 1 for i in rounds):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = r
    if start is not None:
        ranges.append(str(start) if start == prev else f"{start}–{prev}")
    if len(ranges) > MAX_RANGES:
        return ", ".join(ranges[:MAX_RANGES]) + f", … ({len(rounds)} rounds)"
    return ", ".join(ranges)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(md(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]


def _entries(value) -> list:
    return value[:MAX_ENTRIES] if isinstance(value, list) else []


def _parse(entry) -> Optional[tuple[str, int]]:
    """``(site, round)`` of a well-formed entry, else None."""
    if not isinstance(entry, Mapping):
        return None
    site, r = entry.get("site"), entry.get("round")
    if not isinstance(site, str) or not site or isinstance(r, bool) or not isinstance(r, int) or r < 0:
        return None
    return site[:MAX_SITE], r


def _text(value, limit: int) -> Optional[str]:
    if not isinstance(value, str):
        return None
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _pattern(value: Mapping) -> Optional[dict]:
    rounds, always, never = value.get("rounds"), value.get("always_refused"), value.get("never_refused")
    lists_ok = all(isinstance(v, list) and all(isinstance(s, str) for s in v) for v in (always, never))
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not lists_ok:
        return None
    return {"rounds": rounds, "always_refused": [s[:MAX_SITE] for s in always[:100]],
            "never_refused": [s[:MAX_SITE] for s in never[:100]]}


__all__ = ["MAX_ENTRIES", "rounds_text", "training_record", "training_section"]
