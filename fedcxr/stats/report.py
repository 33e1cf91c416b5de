"""``stats.md``: the statistics, the shift diagnosis and the advice as a readable page.

Every name written into it (sites, classes, reasons, the map's sources) goes through the
shared escaper for where it stands (:mod:`fedcxr.escape`): :func:`md` in a table cell,
:func:`text` in prose, :func:`~fedcxr.escape.code` in a code span. So a site folder named
``a|b`` or ``<img>`` cannot break a table or inject markup, and an ordinary name reads as
written (``hospital_a``, not ``hospital\\_a``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from fedcxr.escape import code, md
from fedcxr.escape import md_text as text
from fedcxr.stats import groups as G


def num(value: Optional[float], digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def count(value: Optional[int], k: int) -> str:
    """A released count, or ``supp`` (suppressed at the site: below K, or hidden beside one that is)."""
    return "supp" if value is None else str(value)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def render_markdown(stats: dict, figures: Optional[dict[str, Path]] = None) -> str:
    k = stats["min_count"]
    figures = figures or {}
    lines = [f"# Federation statistics: {text(stats['config'])}", "",
             f"- Gathered: {text(stats['transport'])}; target: {text(stats['target'] or 'none')}; "
             f"sources: {text(', '.join(stats['sources']) or 'none')}",
             f"- Privacy: {text(stats['privacy']['mechanism'])}.",
             f"- `supp`: suppressed at its site and never sent — below {k}, or hidden beside a cell below {k} so "
             "that it cannot be worked out from the totals and the site's other groups. Global sums add the "
             "released counts only, so a global cell is a lower bound wherever a site suppressed it.", ""]
    lines += _advice(stats)
    lines += _sites(stats, k)
    lines += _prevalence(stats, figures)
    lines += _demographics(stats, k, figures)
    lines += _acquisition(stats, k)
    lines += _intensity(stats, figures)
    lines += _shift(stats, figures)
    return "\n".join(lines).rstrip() + "\n"


def _advice(stats: dict) -> list[str]:
    advice = stats["advice"]
    lines = ["## Advice", ""]
    if advice.get("recommendation"):
        lines += [f"**Recommended for {text(advice['target'])}: {text(advice['recommendation'])}** — {text(advice['why'])}", ""]
    else:
        lines += [f"**No recommendation ({text(advice['verdict'])})**: {text(advice.get('why', ''))}", ""]
    inputs = advice.get("inputs") or {}
    if inputs:
        shift = inputs["shift_type"]
        rows = [["shift type", md(shift.get("value")), md(shift.get("why") or "")],
                ["target labels", md(inputs["target_labels"].get("value")), md(inputs["target_labels"].get("from"))],
                ["rounds", md(inputs["rounds"]["value"]), md(inputs["rounds"]["from"])]]
        lines += ["The federation's place in the regime map:", ""] + table(["input", "value", "from"], rows)
        lines += [f"Rule: {text(advice.get('placement', {}).get('rule', ''))}. "
                  f"Caveat: {text(shift.get('caveat') or '')}.", ""]
    cell = advice.get("cell")
    if cell:
        methods = sorted(cell["auroc"], key=lambda m: -cell["auroc"][m])
        lines += [f"Map cell (row {cell['row']}, {cell['n_seeds']} seeds; source: {text(cell['source'])}):", ""]
        lines += table(["method", "mean AUROC"], [[md(m), num(cell["auroc"][m])] for m in methods])
    if advice.get("next"):
        lines += [f"Next step: {code(advice['next'])}", ""]
    pilot = inputs.get("pilot") or {}
    if pilot.get("status") == "ok":
        rows = [[md(s), f"{pilot['d2'][s]:.3g}", f"{pilot['tau2d2'][s]:.3g}", f"{pilot['beta_fedgp'][s]:.2f}",
                 md(pilot["reading"][s])] for s in pilot["beta_fedgp"]]
        lines += [f"Pilot round (FedGP theory; target gradient variance σ² = {pilot['sigma2']:.3g}):", ""]
        lines += table(["source", "d²", "τ²d²", "β (FedGP)", "reading"], rows)
    elif pilot:
        lines += [f"Pilot round: {text(pilot.get('status'))} ({text(pilot.get('reason') or '')})", ""]
    lines += [f"- Note: {text(note)}" for note in pilot.get("notes") or []] + ([""] if pilot.get("notes") else [])
    mp = advice.get("map") or {}
    lines += [f"Regime map: {text(mp.get('path'))} ({mp.get('cells')} cells).", ""]
    return lines


def _sites(stats: dict, k: int) -> list[str]:
    rows = []
    for name, entry in stats["sites"].items():
        split = entry["groups"].get("split") or {}
        counts = split.get("counts") or [None] * 3
        rows.append([md(name), md(entry["status"]), count(split.get("count"), k),
                     *[count(c, k) for c in counts], md(entry.get("message") or "")])
    glob = stats["global"]["groups"].get("split") or {}
    rows.append(["**all sites**", "", count(glob.get("count"), k),
                 *[count(c, k) for c in (glob.get("counts") or [None] * 3)], ""])
    return ["## Sites", ""] + table(["site", "status", "rows", "train", "val", "test", "note"], rows)


def _prevalence(stats: dict, figures: dict) -> list[str]:
    sites = [s for s, e in stats["sites"].items() if e["groups"]]
    classes = [G.group_class(n) for n in stats["global"]["groups"] if G.group_class(n)]
    if not classes:
        return []
    rows = []
    for cls in classes:
        row = [md(cls)]
        for site in sites:
            group = stats["sites"][site]["groups"].get(G.label_group(cls))
            value = stats["sites"][site]["derived"]["prevalence"].get(cls)
            row.append("not labeled" if group is None else num(value, 2) if value is not None else "suppressed")
        value = stats["global"]["derived"]["prevalence"].get(cls)
        row.append(num(value, 2) if value is not None else "suppressed")  # pooled where both cells were released
        rows.append(row)
    lines = ["## Label prevalence (positive / (positive + negative))", "",
             "All sites: pooled over the sites that released both the positive and the negative count.", ""]
    lines += table(["class", *[md(s) for s in sites], "all sites"], rows)
    return lines + _figure(figures, "prevalence", "Label prevalence per site")


def _demographics(stats: dict, k: int, figures: dict) -> list[str]:
    lines = ["## Demographics", ""]
    sites = [s for s, e in stats["sites"].items() if e["groups"]]
    for task in G.DEMOGRAPHICS:
        cats = G.categories(task)
        rows = [[md(c), *[count(_cell(stats["sites"][s], task, i), k) for s in sites],
                 count(_cell(stats["global"], task, i), k)] for i, c in enumerate(cats)]
        lines += [f"**{text(task)}**", ""] + table(["", *[md(s) for s in sites], "all sites"], rows)
    return lines + _figure(figures, "pyramids", "Age/sex pyramids")


def _acquisition(stats: dict, k: int) -> list[str]:
    sites = [s for s, e in stats["sites"].items() if e["groups"]]
    lines = ["## Acquisition (file headers)", ""]
    for site in sites:
        reason = stats["sites"][site]["unavailable"].get("acquisition")
        if reason:
            lines += [f"- {text(site)}: not available ({text(reason)})"]
    lines += [""]
    for name in G.ACQUISITION:
        rows = []
        for i, c in enumerate(G.categories(name)):
            values = [_cell(stats["sites"][s], name, i) for s in sites] + [_cell(stats["global"], name, i)]
            if any(v for v in values):
                rows.append([md(c), *[count(v, k) for v in values]])
        if rows:
            lines += [f"**{text(name)}**", ""] + table(["", *[md(s) for s in sites], "all sites"], rows)
    return lines


def _intensity(stats: dict, figures: dict) -> list[str]:
    rows = []
    for name, entry in list(stats["sites"].items()) + [("all sites", stats["global"])]:
        q = entry["derived"].get("intensity_quantiles")
        reason = (entry.get("unavailable") or {}).get("intensity")
        rows.append([md(name), *([num(q[p], 3) for p in sorted(q)] if q else ["—"] * 5),
                     md(reason or "")])
    lines = ["## Pixel intensity (decoded images, [0, 1])", ""]
    lines += table(["site", "p05", "p25", "p50", "p75", "p95", "note"], rows)
    return lines + _figure(figures, "intensity", "Pixel-intensity distributions")


def _shift(stats: dict, figures: dict) -> list[str]:
    shift = stats["shift"]
    dist = shift["distances"]
    lines = ["## How different are the sites?", ""]
    for kind in ("labels", "demographics", "intensity"):
        entry = dist[kind]
        rows = [[md(a), *[num(v, 3) for v in row]] for a, row in zip(dist["sites"], entry["matrix"])]
        lines += [f"**{text(kind)}** — {text(entry['metric'])}", ""] + table(["", *[md(s) for s in dist["sites"]]], rows)
    tvs = shift.get("target_vs_sources")
    if tvs:
        lines += [f"Target {text(tvs['target'])} against the sources pooled: labels {num(tvs['labels'])}, "
                  f"demographics {num(tvs['demographics'])}, intensity {num(tvs['intensity'], 4)}. "
                  f"Shift type: **{text(shift['type']['value'])}** ({text(shift['type']['why'])}).", ""]
    return lines + _figure(figures, "distances", "Site distances")


def _cell(entry: dict, group: str, i: int) -> Optional[int]:
    found = (entry.get("groups") or {}).get(group)
    if not found:
        return None
    return found["counts"][i]


def _figure(figures: dict, name: str, alt: str) -> list[str]:
    return [f"![{alt}]({figures[name].name})", ""] if name in figures else []

