"""``fedcxr ingest``: one hospital export → canonical per-site manifests, with its row accounting.

The work is :func:`fedcxr.site_adapters.ingest.run_ingest`; this prints what a user checks
first — rows read = kept + set aside, the reasons, and each site's classes and splits.
"""

from __future__ import annotations

import argparse

from fedcxr.logs import progress_wanted


def cli_ingest(args: argparse.Namespace) -> int:
    """Run the ingest (or its plan) the options ask for and print its row accounting, site by site."""
    from fedcxr.site_adapters.ingest import PLAN_NAME, PLAN_SET_ASIDE_NAME, run_ingest

    plan = bool(getattr(args, "plan", False))
    report = run_ingest(
        args.source, args.input, args.out,
        site_by=args.site_by, site_name=args.site_name, uncertain=args.uncertain,
        mapping=args.mapping, labels_csv=args.labels, labels_key=getattr(args, "labels_key", None),
        verify_pixels=args.verify_pixels,
        workers=args.workers, val_fraction=args.val_fraction, test_fraction=args.test_fraction,
        progress=progress_wanted(args), site_key=args.site_key, follow_links=args.follow_links,
        max_pixels=args.max_pixels, readers=args.readers, implied_negatives=getattr(args, "implied_negatives", True), plan=plan,
        keep_non_chest=getattr(args, "keep_non_chest", False),
    )
    would = "would keep" if plan else "kept"
    print(f"{'plan: ' if plan else ''}read {report['rows_read']} rows: {would} {report['rows_kept']}, "
          f"set aside {report['rows_set_aside']}")
    for reason, count in report["set_aside_by_reason"].items():
        print(f"  set aside {count}: {reason}")
    for hint in report.get("hints", []):
        print(f"  hint: {hint}")
    for site, info in report["sites"].items():
        splits = ", ".join(f"{k} {v}" for k, v in info["rows_per_split"].items())
        if info.get("unlabeled"):
            print(f"  site {site}: unlabeled site: {info['rows']} images, no finding labels ({splits}); "
                  "usable by `fedcxr predict` and as FACT's unlabeled target, not as a labeled source")
            continue
        print(f"  site {site}: {info['rows']} rows ({splits}); classes: {', '.join(info['class_set'])}")
        implied = info.get("implied_negatives") or {}
        if implied:
            counts = ", ".join(f"{c} {n}" for c, n in implied.items())
            print(f"    implied negatives (blank on a 'No Finding = 1' row; --no-implied-negatives to keep them "
                  f"unlabeled): {counts}")
    key_line = site_key_line(report.get("site_key") or {}, plan)
    if plan:
        print(f"plan only, no image opened and no manifest written: {args.out / PLAN_NAME} and "
              f"{args.out / PLAN_SET_ASIDE_NAME} (what a plan cannot know is listed under 'cannot_know')")
        if key_line:
            print(key_line)
        return 0
    if key_line:
        print(key_line)
    print(f"manifests in {args.out}/<site>/; {set_aside_where(report, args.out)}")
    return 0


def set_aside_where(report: dict, out) -> str:
    """Where the set-aside rows are listed: all at OUT, each site's own in its folder, and which only at OUT."""
    total, unknown = report["rows_set_aside"], report.get("rows_set_aside_without_site", 0)
    text = f"ingest_report.json and set_aside.csv at {out} list every row set aside ({total})"
    if not report["sites"]:
        return text
    own = ", ".join(f"{site} {info.get('rows_set_aside', 0)}" for site, info in report["sites"].items())
    text += f"; each site's folder lists its own ({own})"
    if unknown:
        text += (f"; {unknown} whose site is not known (no value in the site column, a row the source's "
                 f"reader rejected, a patient with no kept image, or a site set aside) are listed only in {out}")
    return text


def site_key_line(key: dict, plan: bool) -> str:
    """Which site key made the pseudonyms, and so the sites and splits (``''`` for a built-in key).

    A plan names the key that reproduces it; an ingest that created a key says so, because its
    splits then match no earlier plan or ingest (a plan into another folder made its own key).
    """
    if not key.get("file"):
        return ""
    made = " (created by this run" + ("" if plan else "; these pseudonyms and splits differ from any plan or "
                                           "ingest made with another key") + ")" if key.get("created") else ""
    if plan:
        return (f"site key {key['file']}{made}: the sites and splits above are this key's; reproduce them with "
                f"`fedcxr ingest ... --site-key {key['file']}` (another key draws other splits)")
    if made:
        return (f"site key {key['file']}{made}; to reproduce an earlier plan, ingest again with "
                "--site-key PLAN_OUT/.fedcxr_site_key. Keep this key at the site and back it up")
    return f"site key {key['file']} (key id {key.get('key_id')}): the same key gives the same splits on a re-ingest"
