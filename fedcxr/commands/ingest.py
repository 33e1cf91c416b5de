"""``fedcxr ingest``: one hospital export → canonical per-site manifests, with its row accounting.

The work is :func:`fedcxr.site_adapters.ingest.run_ingest`; this prints what a user checks
first — rows read = kept + set aside, the reasons, and each site's classes and splits.
"""

from __future__ import annotations

import argparse

from fedcxr.logs import progress_wanted


def cli_ingest(args: argparse.Namespace) -> int:
    """Run the ingest the options ask for and print its row accounting, site by site."""
    from fedcxr.site_adapters.ingest import run_ingest

    report = run_ingest(
        args.source, args.input, args.out,
        site_by=args.site_by, site_name=args.site_name, uncertain=args.uncertain,
        mapping=args.mapping, labels_csv=args.labels, verify_pixels=args.verify_pixels,
        workers=args.workers, val_fraction=args.val_fraction, test_fraction=args.test_fraction,
        progress=progress_wanted(args), site_key=args.site_key, follow_links=args.follow_links,
        max_pixels=args.max_pixels, readers=args.readers,
    )
    print(f"read {report['rows_read']} rows: kept {report['rows_kept']}, set aside {report['rows_set_aside']}")
    for reason, count in report["set_aside_by_reason"].items():
        print(f"  set aside {count}: {reason}")
    for site, info in report["sites"].items():
        splits = ", ".join(f"{k} {v}" for k, v in info["rows_per_split"].items())
        if info.get("unlabeled"):
            print(f"  site {site}: unlabeled site: {info['rows']} images, no finding labels ({splits}); "
                  "usable by `fedcxr predict` and as FACT's unlabeled target, not as a labeled source")
            continue
        print(f"  site {site}: {info['rows']} rows ({splits}); classes: {', '.join(info['class_set'])}")
    print(f"manifests, ingest_report.json and set_aside.csv in {args.out}")
    return 0
