"""The ``fedcxr`` command line (DESIGN §10).

Each subcommand parses its options here and hands over to the module that does the work,
imported lazily so ``fedcxr ingest`` never pays for importing torch. Exit codes: 0 success,
2 bad usage / invalid config or input (:class:`fedcxr.errors.UserError`), 1 anything else.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import fedcxr
from fedcxr.errors import RunFailed, UserError, disk_full, disk_full_message
from fedcxr.logs import configure as configure_logging
from fedcxr.logs import verbosity

#: subcommand → "module:function(args) -> int"
HANDLERS: dict[str, str] = {
    "init": "fedcxr.commands.init:cli_init",
    "ingest": "fedcxr.commands.ingest:cli_ingest",
    "synth": "fedcxr.commands.synth:cli_synth",
    "train": "fedcxr.commands.train:cli_train",
    "evaluate": "fedcxr.commands.evaluate:cli_evaluate",
    "predict": "fedcxr.commands.predict:cli_predict",
    "export-bundle": "fedcxr.commands.export_bundle:cli_export_bundle",
    "report": "fedcxr.commands.report:cli_report",
    "demo": "fedcxr.commands.demo:cli_demo",
    "sweep": "fedcxr.commands.sweep:cli_sweep",
    "shift": "fedcxr.commands.shift:cli_shift",
    "flare": "fedcxr.commands.flare:cli_flare",
    "stats": "fedcxr.commands.stats:cli_stats",
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default where it says something; keeps option lists readable.

    No ``(default: …)`` on a required option, a flag (``--resume``: default False; ``--no-cross-site``:
    its stored True read as "skipped by default"), an unset (None) or empty-list default, or an
    option whose help already says what happens when it is not given (``unset: …``)."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32, width=100)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.required or default is None or default is argparse.SUPPRESS or isinstance(default, bool)
                or default == [] or "unset:" in text or "%(default)" in text):
            return text
        return super()._get_help_string(action)


#: ``--device`` values: auto, cpu, cuda (the current GPU) or cuda:N (GPU number N)
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def device_name(text: str) -> str:
    """``--device`` checked at parse time (a GPU number that does not exist is refused when the
    run starts, :func:`fedcxr.pipeline.devices.resolve_device`: parsing never imports torch)."""
    value = text.strip().lower()
    if not DEVICE_PATTERN.match(value):
        raise argparse.ArgumentTypeError(f"{text!r}: use auto, cpu, cuda or cuda:N (N: the GPU's number, "
                                         "e.g. cuda:1)")
    return value


def _common() -> argparse.ArgumentParser:
    """``-v``/``--quiet`` on every subcommand (they may come before or after the subcommand)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="also print debug messages")
    group.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="print warnings and results only: no progress bars, no info messages")
    return common


class _SourceHelp(argparse.Action):
    """``fedcxr ingest SOURCE --help``: the source's layout, columns and example, then the options.

    argparse has consumed ``SOURCE`` when it meets ``--help`` after it, so the action can read it.
    """

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        source = getattr(namespace, "source", None)
        if source:
            from fedcxr.site_adapters.ingest import ADAPTERS, help_for

            if source in ADAPTERS:
                print(help_for(source), end="\n\n" + "-" * 100 + "\n")
            else:
                print(f"unknown SOURCE {source!r}; choose one of: {', '.join(sorted(ADAPTERS))}\n")
        parser.print_help()
        parser.exit()


def _device(p: argparse.ArgumentParser, default: Optional[str] = None, what: str = "the config's `device`") -> None:
    """``--device``; ``default`` None means "unset: ``what``" (the config decides)."""
    choices = "auto (CUDA when present), cpu, cuda or cuda:N (GPU number N)"
    p.add_argument("--device", default=default, type=device_name, metavar="auto|cpu|cuda|cuda:N",
                   help=f"where the network runs: {choices}" + (f"; unset: {what}" if default is None else ""))


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="fedcxr", parents=[common], formatter_class=_HelpFormatter,
        description="Federated chest X-ray classification: ingest hospital exports, train, evaluate.",
        epilog="Run `fedcxr COMMAND --help` for a command's options. Exit codes: 0 success, 2 bad input "
               "or usage (the message names the file/row/key), 1 a run that stopped (resume it with --resume).",
    )
    parser.add_argument("--version", action="version", version=f"fedcxr {fedcxr.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common],
                              formatter_class=_HelpFormatter)

    p = command("init", "start a study: a commented experiment config, a csv mapping template and an example export")
    p.add_argument("dir", type=Path, metavar="DIR",
                   help="folder to write into (new or empty): experiment.yaml, mapping.yaml, export/ "
                        "(README: Your own data in three steps)")

    p = sub.add_parser("ingest", help="hospital export → canonical per-site manifests", parents=[common],
                       formatter_class=_HelpFormatter, add_help=False,
                       description="hospital export → canonical per-site manifests",
                       epilog="Run `fedcxr ingest SOURCE --help` for that source's expected layout, columns "
                              "and an example.")
    p.add_argument("-h", "--help", action=_SourceHelp, help="show this help (after SOURCE: also the source's "
                   "expected layout, columns and an example) and exit")
    p.add_argument("source", metavar="SOURCE",
                   help="nih | chexpert | mimic | midrc | dicom | images (DICOM/PNG/JPEG folder) | csv | medmnist "
                        "| rsna | vindr | siim | openi | padchest")
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
                        "splits, per-class counts and rows that would be set aside (nih, chexpert, mimic, csv, rsna, "
                        "vindr, siim, openi, padchest)")
    p.add_argument("--keep-non-chest", action="store_true",
                   help="keep DICOMs whose Modality/BodyPartExamined say they are not chest radiographs "
                        "(flagged in the manifest's not_chest column; unset: set aside with the reason)")
    p.add_argument("--verify-pixels", action="store_true", help="fully decode every image (slower; finds corrupt pixels)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="parallel processes for image checks")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="share of patients in val when the source has no official split")
    p.add_argument("--test-fraction", type=float, default=0.2,
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

    p = command("synth", "write a synthetic multi-hospital export in native formats")
    p.add_argument("--out", required=True, type=Path, help="folder to write the exports into")
    p.add_argument("--sites", nargs="*", default=None,
                   help="which synthetic hospitals: nih_style chexpert_style midrc_style dicom_style; unset: all")
    p.add_argument("--images-per-site", type=int, default=120, help="images per hospital")
    p.add_argument("--image-size", type=int, default=64, help="base image size in pixels")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same export)")

    p = command("train", "run a federated experiment from a YAML config")
    p.add_argument("config", type=Path, metavar="CONFIG.yaml",
                   help="experiment YAML (README: `fedcxr train` — a federated experiment; a commented "
                        "starter: `fedcxr init DIR`)")
    p.add_argument("--out", type=Path, default=None, metavar="RUN_DIR",
                   help="run directory (a finished one is refused: choose a new one); "
                        "unset: runs/<name>-<method>-seed<seed>")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its last complete round (a finished run is left as it is)")
    _device(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted keys allowed, YAML values); repeatable")

    p = command("evaluate", "per-class AUROC report of a run")
    p.add_argument("run_dir", type=Path, help="a finished run directory")
    p.add_argument("--split", default="test", choices=["train", "val", "test"], help="split to evaluate")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="patient-level bootstrap resamples for 95%% CIs (0: DeLong CIs)")
    _device(p, what="the run's device")
    p.add_argument("--cam", type=int, nargs="?", const=3, default=0, metavar="N",
                   help="opt-in: Grad-CAM gallery of the N top-scoring images per class in report.md "
                        "(PNGs under RUN_DIR/cam/, derived from patient pixels); `--cam` alone: N = 3; "
                        "unset: no gallery")

    p = command("predict", "score new images with a trained model (CSV of keys, probabilities, decisions)")
    p.add_argument("run_dir", type=Path, help="a finished run directory (operating points: run `fedcxr evaluate` first)")
    p.add_argument("--input", required=True, type=Path, metavar="DIR",
                   help="a site's manifest folder, or a folder of DICOM/PNG/JPEG files (never written to)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE.csv",
                   help="FILE.csv (no ids, no paths); FILE.private-key-map.csv beside it maps keys to images")
    p.add_argument("--site", default=None, metavar="NAME",
                   help="use this site's own model and thresholds (PFL, FedBN, Individual); unset: the global "
                        "model, and the target's thresholds (or the only evaluated site's)")
    _device(p, default="auto")
    p.add_argument("--cam", type=int, default=0, metavar="N",
                   help="Grad-CAM overlays of the N top-scoring images per class into FILE.cam/ (patient pixels); "
                        "unset: none")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="images per forward pass")
    p.add_argument("--site-key", type=Path, default=None, metavar="FILE",
                   help="site key file for a plain folder's pseudonyms (stable keys across runs); "
                        "unset: $FEDCXR_SITE_KEY, else a fresh key per run")

    p = command("export-bundle", "a trained model as a MONAI bundle (TorchScript + configs for MONAI's runner)")
    p.add_argument("run_dir", type=Path, help="a finished run directory")
    p.add_argument("--out", required=True, type=Path, help="bundle folder to create (new or empty)")
    p.add_argument("--site", default=None, help="export this site's own model (PFL, FedBN, Individual); unset: global")

    p = command("report", "method-comparison table across runs")
    p.add_argument("run_dirs", nargs="+", type=Path, help="evaluated run directories")
    p.add_argument("--out", required=True, type=Path, help="folder for comparison.md/csv/json")
    p.add_argument("--baseline", default=None, help="method the others are tested against; unset: no tests")

    p = command("demo", "synth → ingest → train → evaluate on the embedded default")
    p.add_argument("--out", type=Path, default=Path("fedcxr-demo"), help="folder for everything the demo writes")
    _device(p, default="auto")
    p.add_argument("--quick", action="store_true",
                   help="a smoke check of the pipeline (tests, CI): 2 rounds on 80 images per hospital; its "
                        "test set is tiny, so its numbers mean nothing")

    p = command("sweep", "run methods × seeds and write the comparison table")
    p.add_argument("config", type=Path, help="experiment YAML shared by every run")
    p.add_argument("--methods", nargs="+", required=True, metavar="METHOD",
                   help="method names (README: `fedcxr train` — a federated experiment, table of methods)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method")
    p.add_argument("--out", type=Path, required=True, help="folder: runs/<method>-seed<k>, comparison files")
    p.add_argument("--baseline", default=None, help="method the others are tested against; unset: no tests")
    _device(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key for every run; repeatable")

    p = command("shift", "a seeded covariate shift (noise/gamma/blur) or shortcut marker of one site's images → "
                         "a new site")
    p.add_argument("site_dir", type=Path, help="an ingested site folder (manifest.parquet + site.json)")
    p.add_argument("--out", required=True, type=Path, help="folder for the new site (OUT/<site>) and its PNGs")
    p.add_argument("--kind", required=True, choices=["noise", "gamma", "blur", "mix", "shortcut"],
                   help="noise: Gaussian noise; gamma: contrast curve; blur: Gaussian blur; mix: all three; "
                        "shortcut: a bright corner marker tied to a label (--marker-rates)")
    p.add_argument("--level", type=int, choices=[0, 1, 2, 3, 4], default=None,
                   help="noise/gamma/blur/mix: strength, 0 = none (identity) ... 4 = strong (table: BENCHMARKS.md, "
                        "`fedcxr.site_adapters.shift`)")
    p.add_argument("--marker-rates", type=float, nargs=2, default=None, metavar=("POSITIVE", "NEGATIVE"),
                   help="shortcut: fraction of the class's positive and of its negative rows that get the marker "
                        "(sources 0.95 0.05, target 0.05 0.95: the FedGP papers' ColoredMNIST -90%% case)")
    p.add_argument("--marker-class", default=None,
                   help="shortcut: the class the marker goes with; unset: the site's only class")
    p.add_argument("--seed", type=int, default=0, help="noise seed (same seed, same PNGs)")
    p.add_argument("--site-name", default=None, metavar="NAME", help="name of the new site; unset: the input site's name")

    p = command("flare", "the same run on NVIDIA FLARE (export | simulate | poc | decrypt)")
    p.add_argument("flare_command", choices=["export", "simulate", "poc", "decrypt"],
                   help="export: write a job folder; simulate: FLARE simulator here; poc: POC system on loopback; "
                        "decrypt: open a secure-aggregation run's encrypted final model with a site's key")
    p.add_argument("config", type=Path, help="experiment YAML (decrypt: the run directory)")
    p.add_argument("--out", type=Path, default=None,
                   help="run directory (simulate, poc; unset: runs/<name>-<method>-seed<seed>-flare) "
                        "or job folder (export, required)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key; repeatable")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its last complete round (a finished run is not trained again; "
                        "its cross-site report is kept when every site answered with the same --bootstrap)")
    p.add_argument("--timeout", type=int, default=0, metavar="SECONDS",
                   help="how long a round waits for a site before going on without it (0: no limit)")
    _device(p, what="the config's `device`, at every site")
    p.add_argument("--run-dir", default=None, metavar="RUN_DIR",
                   help="export: the server's run directory (a stable path makes the run resumable); "
                        "unset: a folder in the FLARE job workspace")
    p.add_argument("--no-cross-site", dest="cross_site", action="store_false",
                   help="skip the cross-site evaluation after the last round; unset: each site scores the final "
                        "model on its own test split and sends back only the AUROC summary")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="patient-bootstrap resamples of the cross-site evaluation (0: DeLong CIs)")
    p.add_argument("--context", type=Path, default=None, metavar="FILE",
                   help="decrypt: a client's client_context.tenseal (its FLARE startup kit; privacy.secure_aggregation)")
    _stats_parser(command("stats", "before training: federated statistics, shift diagnosis, method advice"))
    return parser


def _stats_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="experiment YAML (its sites, target, rounds and label budget)")
    p.add_argument("--out", required=True, type=Path, help="folder for stats.json, stats.md and the figures")
    p.add_argument("--min-count", type=int, default=5, metavar="K",
                   help="a count below K is suppressed at its site (null, never sent)")
    p.add_argument("--epsilon", type=float, default=None, metavar="E",
                   help="Laplace noise on every count, budget E per site split over its groups; unset: no noise")
    p.add_argument("--flare", choices=["simulate", "poc"], default=None,
                   help="gather the statistics through NVIDIA FLARE's federated statistics workflow "
                        "(simulator or POC system on loopback); unset: in-process")
    p.add_argument("--no-pilot", dest="pilot", action="store_false",
                   help="skip the one-round pilot estimate of σ², d², τ²d² (it trains one round)")
    p.add_argument("--no-cache-build", dest="cache_build", action="store_false",
                   help="report pixel intensities only where the decode-once cache exists (never decode images)")
    p.add_argument("--no-headers", dest="headers", action="store_false",
                   help="skip the acquisition section (reads every image file's header)")
    p.add_argument("--regime-map", type=Path, default=None, metavar="CSV",
                   help="regime map to advise from; unset: the map shipped with fedcxr")
    _device(p, what="the config's `device` (pilot round)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key; repeatable")


def _resolve(name: str) -> Callable[[argparse.Namespace], int]:
    module_name, func_name = HANDLERS[name].split(":")
    return getattr(importlib.import_module(module_name), func_name)


#: what a command that stopped on a full disk leaves behind (train-like commands: RunFailed's own advice)
DISK_FULL_ADVICE = {
    "evaluate": "report files written before are kept whole (atomic writes); run `fedcxr evaluate` again",
    "ingest": "no half-written manifest is kept (atomic writes); run the ingest again",
    "predict": "no half-written CSV is kept (atomic writes); run `fedcxr predict` again",
    "export-bundle": "remove the half-made bundle folder and export again",
    "report": "files written before are kept whole (atomic writes); run `fedcxr report` again",
}


def _run_command(args: argparse.Namespace) -> int:
    """The subcommand's handler; a full disk anywhere becomes :class:`RunFailed` (exit 1), not a traceback."""
    try:
        return int(_resolve(args.command)(args) or 0)
    except (UserError, RunFailed, KeyboardInterrupt):
        raise
    except Exception as exc:
        full = disk_full(exc)
        if full is None:
            raise
        raise RunFailed(disk_full_message(full), advice=DISK_FULL_ADVICE.get(args.command)) from exc


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(verbosity(args))
    try:
        return _run_command(args)
    except UserError as exc:
        print(f"fedcxr {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        advice = getattr(exc, "advice", None) or RunFailed.ADVICE
        print(f"fedcxr {args.command}: run stopped: {exc}\n  {advice}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
