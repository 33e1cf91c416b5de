"""``fedcxr demo``: the embedded default, end to end on a laptop CPU in about two minutes.

The work — synth → ingest → train three ways → evaluate → compare, and the demo's config — is
:mod:`fedcxr.workflows.demo`; this prints its steps as they happen, then the side-by-side table
with 95% intervals and paired tests against the hospital alone, and where each report is.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from fedcxr.commands.options import add_device

HELP = "synth → ingest → train → evaluate on the embedded default"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("fedcxr-demo"), help="folder for everything the demo writes")
    add_device(p, default="auto")
    p.add_argument("--quick", action="store_true",
                   help="a smoke check of the pipeline (tests, CI): 2 rounds on 80 images per hospital; its "
                        "test set is tiny, so its numbers mean nothing")


def run(args: argparse.Namespace) -> int:
    from fedcxr.logs import progress_wanted
    from fedcxr.workflows.demo import run_demo

    result = run_demo(Path(args.out), device=args.device, quick=args.quick, progress=progress_wanted(args),
                      announce=print)
    print_table(result.comparison, result.target)
    if args.quick:
        print(quick_warning(result.n_test, result.target, result.rounds))
    print(f"done in {result.seconds:.0f} s. Comparison: {result.files[0]}")
    print(f"  each run's report: {result.out / 'runs'}/<method>/report.md (per class, subgroups, ROC curves)")
    return 0


def quick_warning(n_test: int, target: str, rounds: int) -> str:
    """What ``--quick`` numbers are worth: nothing (a smoke check of the pipeline, not a result)."""
    return (f"  --quick is a smoke check, not a result: {rounds} rounds, and {target}'s test split holds only "
            f"{n_test} images, so these AUROCs and p-values mean nothing. Run `fedcxr demo` without --quick "
            "for the comparison the README reports.\n")


def print_table(comparison: dict, target: str) -> dict[str, float]:
    """The side-by-side table on the console, small-sample means marked ``†k/K`` with the footnote;
    returns each method's mean AUROC at the target."""
    from fedcxr.evaluation.compare import SMALL_SAMPLE_FOOTNOTE, small_sample_mark
    from fedcxr.evaluation.report_markdown import fmt_ci

    column = next(c["label"] for c in comparison["columns"] if c["site"] == target)
    tests = {t["method"]: t for t in comparison["tests"] if t["column"] == column}
    baseline = comparison["baseline"]
    print(f"\n  {target}: mean test AUROC over its classes, 95% CI (patient bootstrap unless marked †)")
    print(f"  {'method':<28} {'mean AUROC':<28} vs {baseline} (paired t over classes)")
    means, marked = {}, False
    for row in comparison["table"]:
        cell = row["cells"].get(column, {})
        mean, low, high = cell.get("auroc_mean"), cell.get("auroc_ci_low"), cell.get("auroc_ci_high")
        means[row["method"]] = mean
        shown = fmt_ci(mean, low, high) + small_sample_mark(cell)
        marked = marked or bool(small_sample_mark(cell))
        test = tests.get(row["method"])
        versus = "—"
        if test:
            diff, p = test["ttest"]["mean_difference"], test["ttest"]["p_value"]
            versus = f"{diff:+.3f}, p = {p:.3g}" if p == p else f"{diff:+.3f}"
        print(f"  {row['method']:<28} {shown:<28} {versus}")
    if marked:
        print(textwrap.fill(SMALL_SAMPLE_FOOTNOTE, width=100, initial_indent="  ", subsequent_indent="  "))
    print()
    return means
