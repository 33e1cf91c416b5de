"""The ``fedcxr`` command line (DESIGN §10).

Each subcommand parses its options here and hands over to the module that does the work,
imported lazily so ``fedcxr ingest`` never pays for importing torch. Exit codes: 0 success,
2 bad usage / invalid config or input (:class:`fedcxr.errors.UserError`), 1 anything else.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from fedcxr.errors import RunFailed, UserError

#: subcommand → "module:function(args) -> int"
HANDLERS: dict[str, str] = {
    "ingest": "fedcxr.cli:_ingest",
    "synth": "fedcxr.synth:cli_synth",
    "train": "fedcxr.commands.train:cli_train",
    "evaluate": "fedcxr.commands.evaluate:cli_evaluate",
    "report": "fedcxr.commands.report:cli_report",
    "demo": "fedcxr.commands.demo:cli_demo",
    "sweep": "fedcxr.commands.sweep:cli_sweep",
    "flare": "fedcxr.flare.cli:cli_flare",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedcxr",
        description="Federated chest X-ray classification: ingest hospital exports, train, evaluate.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("ingest", help="hospital export → canonical per-site manifests")
    p.add_argument("source", metavar="SOURCE", help="nih | chexpert | mimic | midrc | dicom | csv | medmnist")
    p.add_argument("--input", required=True, type=Path, help="export root folder")
    p.add_argument("--out", required=True, type=Path, help="output folder (one subfolder per site)")
    p.add_argument("--site-by", default=None,
                   help="COLUMN | conditions:c1,c2,... | chexpert-conditions | iid:K[:shared=S|:classes=..] "
                        "| skew:K[:alpha=A][:seed=N]")
    p.add_argument("--site-name", default=None, help="site name when the whole source is one site")
    p.add_argument("--uncertain", default="ignore", choices=["zeros", "ones", "ignore"],
                   help="policy for uncertain (-1) labels (default: ignore → NaN, masked)")
    p.add_argument("--mapping", type=Path, default=None, help="YAML column mapping (csv source)")
    p.add_argument("--labels", type=Path, default=None,
                   help="label csv keyed by SOPInstanceUID/StudyInstanceUID/file name (dicom source)")
    p.add_argument("--verify-pixels", action="store_true", help="fully decode every image")
    p.add_argument("--workers", type=int, default=1, help="parallel processes for image checks")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("synth", help="write a synthetic multi-hospital export in native formats")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--sites", nargs="*", default=None, help="which synthetic hospitals (default: all)")
    p.add_argument("--images-per-site", type=int, default=120)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("train", help="run a federated experiment from a YAML config")
    p.add_argument("config", type=Path)
    p.add_argument("--out", type=Path, default=None, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue from the last complete round")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted keys allowed); repeatable")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("evaluate", help="per-class AUROC report of a run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for 95%% CIs")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])

    p = sub.add_parser("report", help="method-comparison table across runs")
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--baseline", default=None, help="method to test the others against")

    p = sub.add_parser("demo", help="synth → ingest → train → evaluate on the embedded default")
    p.add_argument("--out", type=Path, default=Path("fedcxr-demo"))
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="an even smaller run (tests, smoke checks)")

    p = sub.add_parser("sweep", help="run methods × seeds and write the comparison table")
    p.add_argument("config", type=Path)
    p.add_argument("--methods", nargs="+", required=True)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--baseline", default=None)
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    p = sub.add_parser("flare", help="the same run on NVIDIA FLARE (export | simulate | poc)")
    p.add_argument("flare_command", choices=["export", "simulate", "poc"])
    p.add_argument("config", type=Path)
    p.add_argument("--out", type=Path, default=None, help="run directory (simulate, poc) or job folder (export)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--resume", action="store_true", help="continue from the last complete round")
    p.add_argument("--timeout", type=int, default=0, metavar="SECONDS",
                   help="how long a round waits for a site before going on without it (0: no limit)")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"], help="the sites' device")
    p.add_argument("--run-dir", default=None, help="export: the server's run directory (stable path: resumable)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _ingest(args: argparse.Namespace) -> int:
    from fedcxr.site_adapters.ingest import run_ingest

    report = run_ingest(
        args.source, args.input, args.out,
        site_by=args.site_by, site_name=args.site_name, uncertain=args.uncertain,
        mapping=args.mapping, labels_csv=args.labels, verify_pixels=args.verify_pixels,
        workers=args.workers, val_fraction=args.val_fraction, test_fraction=args.test_fraction,
        progress=not args.quiet,
    )
    print(f"read {report['rows_read']} rows: kept {report['rows_kept']}, set aside {report['rows_set_aside']}")
    for reason, count in report["set_aside_by_reason"].items():
        print(f"  set aside {count}: {reason}")
    for site, info in report["sites"].items():
        splits = ", ".join(f"{k} {v}" for k, v in info["rows_per_split"].items())
        print(f"  site {site}: {info['rows']} rows ({splits}); classes: {', '.join(info['class_set'])}")
    print(f"manifests and ingest_report.json in {args.out}")
    return 0


def _resolve(name: str) -> Callable[[argparse.Namespace], int]:
    module_name, func_name = HANDLERS[name].split(":")
    return getattr(importlib.import_module(module_name), func_name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(_resolve(args.command)(args) or 0)
    except UserError as exc:
        print(f"fedcxr {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"fedcxr {args.command}: run stopped: {exc}\n"
              "  checkpoints of the completed rounds are kept; fix the cause and continue with --resume",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
