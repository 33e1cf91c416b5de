"""What a run's training refused and missed, for its evaluation report (issue 27 item 4).

A report that lists the training sites but not that one of them was refused in every round
reads as an honest consortium's result. :func:`training_record` summarises ``run.json``'s
``refused`` (replies the reply checks left out, ``defences:``), ``missed`` (sites that did not
answer) and ``refusal_pattern``, compactly — per site: how many replies, in which rounds, by
which check, with one reason as an example; per absent site, why (late, dropped out, error, refused,
no reply; with the first reason of each kind, e.g. FLARE's ``disconnected``) — and :func:`training_section`
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
#: the kind of an absence ``run.json`` gives none for (a run written before reasons were kept)
NO_REPLY = "no reply"


#: how the report names why an asked site took no part (``run.json`` ``missed`` ``why``)
WHY = {"late": "late (deadline)", "dropped": "dropped out", "error": "error", "refused": "refused",
       "no reply": "no reply"}


def training_record(run_info: Mapping[str, Any]) -> Optional[dict]:
    """``{"status", "refused": [...], "missed": [...], "pattern", "skipped", "consortium"}`` from
    ``run.json``, or ``None`` when it records neither (a run directory written before the reply checks).

    ``refused``: per site ``{site, n, rounds, checks: {check: n}, reason}`` (the first reason);
    ``missed``: per site ``{site, n, rounds, why: {late (deadline) | dropped out | error | refused |
    no reply: n}, first: {why: reason}}`` for replies that never came or came too late, with the first
    reason met for each ``why`` (a reply the reply checks refused is also in ``run.json``'s ``missed``,
    marked ``rejected:``; it is counted under ``refused`` only, the wire's refusals on FLARE here);
    ``consortium``: the sampled share and the simulated clock (:func:`consortium_record`) or None;
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
        row = missed.setdefault(site, {"site": site, "n": 0, "rounds": set(), "why": {}, "first": {}})
        reason = _text(entry.get("reason"), MAX_REASON)
        why = _why(entry.get("why"), reason)
        row["n"] += 1
        row["rounds"].add(r)
        row["why"][why] = row["why"].get(why, 0) + 1
        if reason and reason != why and why not in row["first"]:
            row["first"][why] = reason
    skipped += sum(max(0, len(v) - MAX_ENTRIES) for v in (run_info.get("refused"), run_info.get("missed"))
                   if isinstance(v, list))
    finish = lambda rows: [{**row, "rounds": sorted(row["rounds"])} for row in rows.values()]  # noqa: E731
    pattern = run_info.get("refusal_pattern")
    return {"status": _text(run_info.get("status"), MAX_CHECK), "refused": finish(refused), "missed": finish(missed),
            "pattern": _pattern(pattern) if isinstance(pattern, Mapping) else None, "skipped": skipped,
            "consortium": consortium_record(run_info)}


def _why(why, reason: Optional[str]) -> str:
    """The report's name for an absence's kind; an entry without one (a run written before kinds were kept)
    is read from its reason: FLARE's ``disconnected`` dropped out, ``no answer within N s`` late."""
    if isinstance(why, str) and why in WHY:
        return WHY[why]
    if reason and reason.startswith("disconnected"):
        return WHY["dropped"]
    if reason and reason.startswith(("no answer within", "no reply within")):
        return WHY["late"]
    return NO_REPLY


def _why_text(row: Mapping[str, Any]) -> str:
    first = row.get("first") or {}
    return ", ".join(f"{why} × {n}" + (f" (first: {first[why]})" if why in first else "")
                     for why, n in sorted(row.get("why", {}).items()))


def consortium_record(run_info: Mapping[str, Any]) -> Optional[dict]:
    """``{"fraction", "min_sites", "deadline_s", "sources", "clock_s", "rounds"}`` of a run that sampled its
    sources (``participation:``) or kept a simulated clock (``simulate:``); None otherwise (numbers only)."""
    config = run_info.get("config") if isinstance(run_info.get("config"), Mapping) else {}
    spec = config.get("participation") if isinstance(config.get("participation"), Mapping) else {}
    clock = run_info.get("simulated") if isinstance(run_info.get("simulated"), Mapping) else {}
    fraction, deadline = _number(spec.get("fraction")), _number(spec.get("deadline_s"))
    clock_s = _number(clock.get("clock_s"))
    rounds = clock.get("round_s") if isinstance(clock.get("round_s"), list) else []
    if (fraction is None or fraction >= 1) and deadline is None and clock_s is None:
        return None
    sources = run_info.get("sources")
    return {"fraction": fraction, "min_sites": _number(spec.get("min_sites")), "deadline_s": deadline,
            "sources": len(sources) if isinstance(sources, list) else None, "clock_s": clock_s,
            "rounds": sum(1 for v in rounds[:MAX_ENTRIES] if _number(v) is not None)}


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 1e15:
        return None
    return float(value)


def training_section(report: Mapping[str, Any]) -> list[str]:
    """The report's Markdown lines on refused and missed training replies ([] without a record)."""
    record = report.get("training")
    if not record:
        return []
    lines = ["## Training: refused and missed replies", ""]
    refused, missed = record["refused"], record["missed"]
    lines += consortium_lines(record.get("consortium"))
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
        lines += ["Sites asked for a training task whose reply did not count (the round went on without them): "
                  "late (deadline) — no reply before the round's deadline (`participation.deadline_s`, on FLARE "
                  "else `--timeout`); dropped out — the site left the round (on FLARE, \"disconnected\": the server "
                  "had lost the site's client and did not ask it); error — it answered with an error; refused — "
                  "the transport refused its reply. The first reason of each kind is quoted:", ""]
        rows = [[row["site"], str(row["n"]), rounds_text(row["rounds"]), _why_text(row)] for row in missed]
        lines += _table(["Site", "Missed", "Rounds", "Why"], rows) + [""]
    pattern = record.get("pattern")
    if pattern:
        lines += [f"Over {md(pattern['rounds'])} rounds, {md(', '.join(pattern['always_refused']))} had a reply "
                  f"refused in every round while {md(', '.join(pattern['never_refused']))} never did: a lone faulty "
                  "site, or — when the refused are the majority — a model taken over by the site that passes.", ""]
    if record.get("skipped"):
        lines += [f"{md(record['skipped'])} entries of `run.json` `refused`/`missed` were not readable records and "
                  "are not counted here.", ""]
    return lines


def consortium_lines(consortium: Optional[Mapping]) -> list[str]:
    """What a sampled or simulated run's rounds were: the share asked, the deadline, the simulated clock."""
    if not consortium:
        return []
    parts = []
    fraction, sources = consortium.get("fraction"), consortium.get("sources")
    if fraction is not None and fraction < 1:
        of = f" of the {sources:.0f} sources" if sources else ""
        parts.append(f"Each round asked a share of {fraction:g}{of} (at least {consortium.get('min_sites') or 1:.0f}, "
                     "drawn from the seed: `participation:`); a site that was not asked did not miss the round")
    if consortium.get("deadline_s") is not None:
        parts.append(f"a round's training tasks closed at {consortium['deadline_s']:g} s")
    if consortium.get("clock_s") is not None:
        parts.append(f"on the simulated clock (`simulate:`) the {consortium.get('rounds') or 0} rounds took "
                     f"{consortium['clock_s']:.1f} s ({consortium['clock_s'] / 3600:.2f} h)")
    text = "; ".join(parts)  # numbers formatted here and fixed words only: nothing to escape
    return [text[0].upper() + text[1:] + ".", ""] if text else []


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


__all__ = ["MAX_ENTRIES", "WHY", "consortium_lines", "consortium_record", "rounds_text", "training_record",
           "training_section"]
