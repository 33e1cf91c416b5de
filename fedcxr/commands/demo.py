"""``fedcxr demo``: the embedded default, end to end on a laptop CPU in about two minutes.

It answers the question a hospital asks first — *does federating help my hospital, and does
the papers' method help more?* — on four synthetic hospitals in their native export formats:

synth → ingest (one manifest per hospital) → train the target hospital three ways on half of
its labels → evaluate each on the target's test split → one side-by-side table with 95%
intervals and paired tests against the hospital alone:

* ``Target_Only`` — the hospital trains alone;
* ``FedAvg_Finetune`` — the three other hospitals federate (FedAvg), the hospital fine-tunes;
* ``FedAvg_Finetune_AuxInfo_GP`` — the AuxInfo+GP paper's method: every site also learns the
  demographic auxiliary tasks, and the target projects the sources' updates onto its own.

Every hospital contributes: ``midrc_style`` labels only COVID-19, which the target labels too.
Everything lands under ``--out``; the comparison and each run's report are printed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import textwrap
import time
from pathlib import Path

import yaml

DEMO_TARGET = "dicom_style"
#: (method, what it means to a hospital), in the order of the table
METHODS = (
    ("Target_Only", "the hospital alone"),
    ("FedAvg_Finetune", "federated (FedAvg), then fine-tuned"),
    ("FedAvg_Finetune_AuxInfo_GP", "the papers' method (AuxInfo + GP)"),
)


def demo_config(manifests: Path, sites: list[str], target: str, *, quick: bool) -> dict:
    """The demo's experiment config (a plain mapping, written next to the runs as YAML)."""
    sources = [s for s in sites if s != target]
    return {
        "name": "demo",
        "manifests": str(manifests.resolve()),
        "sites": sources,
        "target": target,
        "method": "FedAvg_Finetune",
        "rounds": 2 if quick else 10,
        "source": {"lr": 2e-3, "batch_size": 32, "epochs": 1},
        "target_train": {"lr": 1e-3, "batch_size": 32, "epochs": 1 if quick else 2, "labeled": 0.5},
        "model": {"backbone": "resnet_tiny", "hidden": 64},
        "image_size": 48 if quick else 64,
        "augment": not quick,
        "device": "auto",
        "seed": 0,
        "cache_dir": str((manifests.parent / "cache").resolve()),
    }


def run_demo(out: Path, *, device: str = "auto", quick: bool = False, progress: bool = True) -> dict:
    """Run the whole demo into ``out``; returns the comparison and the target's mean AUROC per method."""
    from fedcxr.commands.evaluate import evaluate_run
    from fedcxr.evaluation.compare import compare_runs, write_comparison
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    started = time.perf_counter()
    out = Path(out)
    export, manifests, runs = out / "export", out / "manifests", out / "runs"
    n_images = 80 if quick else 500
    print(f"[1/4] synthesising four hospital exports ({n_images} images each) in {export}")
    write_synthetic_export(export, images_per_site=n_images, image_size=64, seed=0)
    print(f"[2/4] ingesting them into per-site manifests in {manifests}")
    site_dirs = ingest_synthetic(export, manifests, progress=progress)
    sites = sorted(Path(d).name for d in site_dirs.values())
    target = DEMO_TARGET if DEMO_TARGET in sites else sites[-1]
    data = demo_config(manifests, sites, target, quick=quick)
    data["device"] = device
    (out / "demo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    print(f"[3/4] training for target {target} (half of its training labels), sources "
          f"{', '.join(s for s in sites if s != target)}:")
    run_dirs = []
    for method, meaning in METHODS:
        cfg = load_config(data={**data, "method": method})
        run_dir = runs / method
        if run_dir.exists():
            shutil.rmtree(run_dir)  # the demo always starts afresh
        t0 = time.perf_counter()
        run_experiment(cfg, run_dir, device=device, progress=progress)
        report = evaluate_run(run_dir, split="test", n_boot=200 if quick else 500, device=device)
        n_test = (report["sites"].get(target) or {}).get("n_rows", 0)
        print(f"      {method:<28} {meaning:<38} {time.perf_counter() - t0:5.0f} s")
        run_dirs.append(run_dir)
    print(f"[4/4] comparing on {target}'s test split")
    comparison = compare_runs(run_dirs, baseline=METHODS[0][0], n_boot=200 if quick else 500)
    paths = write_comparison(comparison, out)
    means = print_table(comparison, target)
    if quick:
        print(quick_warning(n_test, target, data["rounds"]))
    print(f"done in {time.perf_counter() - started:.0f} s. Comparison: {paths[0]}")
    print(f"  each run's report: {runs}/<method>/report.md (per class, subgroups, ROC curves)")
    return {"comparison": paths[0], "runs": {m: runs / m for m, _ in METHODS}, "mean_auroc": means,
            "seconds": time.perf_counter() - started}


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


def cli_demo(args: argparse.Namespace) -> int:
    from fedcxr.logs import progress_wanted

    run_demo(Path(args.out), device=args.device, quick=args.quick, progress=progress_wanted(args))
    return 0
