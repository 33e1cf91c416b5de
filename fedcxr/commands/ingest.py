"""``fedcxr ingest``: one hospital export → canonical per-site manifests, with its row accounting.

The work is :func:`fedcxr.workflows.ingest.ingest`; this prints what a user checks first — rows
read = kept + set aside, the reasons, and each site's classes and splits. The SOURCE list, the
sources ``--plan`` names and ``fedcxr ingest SOURCE --help`` all come from the one declaration
of every source (:data:`fedcxr.site_adapters.sources.SOURCES`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.wording import count

HELP = "hospital export → canonical per-site manifests"
EPILOG = "Run `fedcxr ingest SOURCE --help` for that source's expected layout, columns and an example."


class SourceHelp(argparse.Action):
    """``fedcxr ingest SOURCE --help``: the source's layout, columns and example, then the options.

    argparse has consumed ``SOURCE`` when it meets ``--help`` after it, so the action can read it.
    """

    HELP = "show this help (after SOURCE: also the source's expected layout, columns and an example) and exit"

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from fedcxr.site_adapters.sources import SOURCES

        source = getattr(namespace, "source", None)
        if source:
            if source in SOURCES:
                print(SOURCES[source].help(), end="\n\n" + "-" * 100 + "\n")
            else:
                from fedcxr.suggest import did_you_mean

                print(f"unknown SOURCE {source!r}{did_you_mean(source, SOURCES)}; choose one of: "
                      f"{', '.join(sorted(SOURCES))}\n")
        parser.print_help()
        parser.exit()


#: ``-h`` is this command's own: after SOURCE it also prints the source's help
HELP_ACTION = SourceHelp


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fedcxr.site_adapters.sources import plan_sources, source_list

    p.add_argument("source", metavar="SOURCE", help=source_list())
    p.add_argument("--input", required=True, type=Path, metavar="DIR", help="export root folder")
    p.add_argument("--out", required=True, type=Path, metavar="OUT", help="output folder (one subfolder per site)")
    p.add_argument("--site-by", default=None,
                   help="COLUMN | conditions:c1,c2,... | chexpert-conditions | iid:K[:shared=S|:classes=..] "
                        "| skew:K[:alpha=A][:seed=N]; unset: the whole export is one site")
    p.add_argument("--site-name", default=None, help="site name when the whole export is one site; unset: SOURCE")
    p.add_argument("--uncertain", default="ignore", choices=["zeros", "ones", "ignore"],
                   help="policy for uncertain (-1) labels (ignore → NaN, masked out of the loss)")
    p.add_argument("--mapping", type=Path, default=None, metavar="FILE.yaml",
                   help="YAML column mapping (csv source; README: The `csv` mapping; a commented template: "
                        "`fedcxr init DIR`)")
    p.add_argument("--labels", type=Path, default=None, metavar="FILE.csv",
                   help="label csv keyed by SOPInstanceUID/StudyInstanceUID/file name, or by --labels-key "
                        "(dicom, images sources)")
    p.add_argument("--labels-key", default=None, metavar="TAG[=COLUMN]",
                   help="the DICOM keyword the --labels csv is keyed by (PatientID, AccessionNumber, ...), "
                        "matched against the csv column of that name (case, spaces and _ ignored) or COLUMN; "
                        "unset: SOPInstanceUID, a file column or StudyInstanceUID, found by column name")
    p.add_argument("--no-implied-negatives", dest="implied_negatives", action="store_false",
                   help="chexpert, mimic: keep a blank pathology on a 'No Finding = 1' row unlabeled (default: "
                        "a negative, the CheXpert labeler's rule; Support Devices excepted)")
    p.add_argument("--plan", action="store_true",
                   help="read the metadata only (never open an image) and write OUT/ingest_plan.json: the sites, "
                        "splits, per-class counts and rows that would be set aside (" + ", ".join(plan_sources()) + ")")
    p.add_argument("--keep-non-chest", action="store_true",
                   help="keep DICOMs whose Modality/BodyPartExamined say they are not chest radiographs "
                        "(flagged in the manifest's not_chest column; unset: set aside with the reason)")
    p.add_argument("--verify-pixels", action="store_true", help="fully decode every image (slower; finds corrupt pixels)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="parallel processes for image checks")
    p.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                   help="share of patients in val when the source has no official split")
    p.add_argument("--test-fraction", type=float, default=0.2, metavar="F",
                   help="share of patients in test when the source has no official split")
    p.add_argument("--site-key", type=Path, default=None, metavar="FILE",
                   help="secret key for the keyed patient/study pseudonyms (stays at the site; "
                        "unset: $FEDCXR_SITE_KEY, else OUT/.fedcxr_site_key, created on first use)")
    p.add_argument("--max-pixels", type=int, default=100_000_000, metavar="N",
                   help="set aside an image whose header declares more pixel values (DICOM: rows x "
                        "columns x frames x samples), before decoding it; training decodes under the same bound")
    p.add_argument("--follow-links", action="store_true",
                   help="accept image paths whose symbolic links lead out of the export folder "
                        "(unset: such rows are set aside with the reason)")
    p.add_argument("--readers", default="any", choices=["any", "majority"],
                   help="vindr: a finding is positive when any of the image's radiologists names it "
                        "(TorchXRayVision's reading) or when most of them do (a tie is uncertain, -1)")


def run(args: argparse.Namespace) -> int:
    """Run the ingest (or its plan) the options ask for and print its row accounting, site by site."""
    from fedcxr.logs import progress_wanted
    from fedcxr.site_adapters.ingest import PLAN_SET_ASIDE_NAME
    from fedcxr.workflows.ingest import ingest

    plan = bool(getattr(args, "plan", False))
    result = ingest(
        args.source, args.input, args.out, plan=plan, progress=progress_wanted(args),
        site_by=args.site_by, site_name=args.site_name, uncertain=args.uncertain,
        mapping=args.mapping, labels_csv=args.labels, labels_key=getattr(args, "labels_key", None),
        verify_pixels=args.verify_pixels,
        workers=args.workers, val_fraction=args.val_fraction, test_fraction=args.test_fraction,
        site_key=args.site_key, follow_links=args.follow_links,
        max_pixels=args.max_pixels, readers=args.readers, implied_negatives=getattr(args, "implied_negatives", True),
        keep_non_chest=getattr(args, "keep_non_chest", False),
    )
    report = result.report
    would = "would keep" if plan else "kept"
    print(f"{'plan: ' if plan else ''}read {count(report['rows_read'], 'row')}: {would} {report['rows_kept']}, "
          f"set aside {report['rows_set_aside']}")
    for reason, n in report["set_aside_by_reason"].items():
        print(f"  set aside {n}: {reason}")
    for hint in report.get("hints", []):
        print(f"  hint: {hint}")
    for site, info in report["sites"].items():
        splits = ", ".join(f"{k} {v}" for k, v in info["rows_per_split"].items())
        if info.get("unlabeled"):
            print(f"  site {site}: unlabeled site: {count(info['rows'], 'image')}, no finding labels ({splits}); "
                  "usable by `fedcxr predict` and as FACT's unlabeled target, not as a labeled source")
            continue
        print(f"  site {site}: {count(info['rows'], 'row')} ({splits}); classes: {', '.join(info['class_set'])}")
        implied = info.get("implied_negatives") or {}
        if implied:
            counts = ", ".join(f"{c} {n}" for c, n in implied.items())
            print(f"    implied negatives (blank on a 'No Finding = 1' row; --no-implied-negatives to keep them "
                  f"unlabeled): {counts}")
    key_line = site_key_line(report.get("site_key") or {}, plan)
    if plan:
        print(f"plan only, no image opened and no manifest written: {result.plan} and "
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
