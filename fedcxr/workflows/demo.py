"""``fedcxr demo`` as a library function: the embedded default, end to end on a laptop CPU.

It answers the question a hospital asks first — *does federating help my hospital, and does
the papers' method help more?* — on four synthetic hospitals in their native export formats:

synth → ingest (one manifest per hospital) → train the target hospital three ways on half of
its labels → evaluate each on the target's test split → one comparison with 95% intervals and
paired tests against the hospital alone:

* ``Target_Only`` — the hospital trains alone;
* ``FedAvg_Finetune`` — the three other hospitals federate (FedAvg), the hospital fine-tunes;
* ``FedAvg_Finetune_AuxInfo_GP`` — the AuxInfo+GP paper's method: every site also learns the
  demographic auxiliary tasks, and the target projects the sources' updates onto its own.

Every hospital contributes: ``midrc_style`` labels only COVID-19, which the target labels too.
Everything lands under ``out``. :func:`demo_config` is the demo's experiment config (the
benchmarks and the FLARE README test start from it); :func:`run_demo` narrates its steps through
``announce`` and returns a :class:`DemoResult` (the command prints the table).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from fedcxr.pipeline.protocols.methods import DEMO_METHODS
from fedcxr.rundir import RunDir

log = logging.getLogger(__name__)

DEMO_TARGET = "dicom_style"
#: (method, what it means to a hospital), in the order of the table: the protocols package's
#: :data:`~fedcxr.pipeline.protocols.methods.DEMO_METHODS` (method names live there)
METHODS = DEMO_METHODS


def demo_config(manifests: Path, sites: list[str], target: str, *, quick: bool) -> dict:
    """The demo's experiment config (a plain mapping, written next to the runs as YAML)."""
    sources = [s for s in sites if s != target]
    return {
        "name": "demo",
        "manifests": str(manifests.resolve()),
        "sites": sources,
        "target": target,
        "method": METHODS[1][0],  # federated, then fine-tuned
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


@dataclass(frozen=True)
class DemoResult:
    """What the demo wrote: ``comparison`` (``comparison.json``'s content) and its files, each method's
    run directory, the target, its test split's size and the rounds trained."""

    out: Path
    comparison: dict[str, Any] = field(repr=False)
    files: list[Path]
    runs: dict[str, RunDir]
    target: str
    n_test: int
    rounds: int
    seconds: float


def run_demo(out: Path | str, *, device: str = "auto", quick: bool = False, progress: bool = True,
             announce: Optional[Callable[[str], None]] = None) -> DemoResult:
    """Run the whole demo into ``out`` (each run starts afresh); ``announce`` is told each step
    (unset: logged at INFO)."""
    import yaml

    from fedcxr.evaluation.compare import compare_runs, write_comparison
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.synth import ingest_synthetic, write_synthetic_export
    from fedcxr.workflows.evaluate import evaluate

    say = announce or log.info
    started = time.perf_counter()
    out = Path(out)
    export, manifests, runs = out / "export", out / "manifests", out / "runs"
    n_images = 80 if quick else 500
    say(f"[1/4] synthesising four hospital exports ({n_images} images each) in {export}")
    write_synthetic_export(export, images_per_site=n_images, image_size=64, seed=0)
    say(f"[2/4] ingesting them into per-site manifests in {manifests}")
    site_dirs = ingest_synthetic(export, manifests, progress=progress)
    sites = sorted(Path(d).name for d in site_dirs.values())
    target = DEMO_TARGET if DEMO_TARGET in sites else sites[-1]
    data = demo_config(manifests, sites, target, quick=quick)
    data["device"] = device
    (out / "demo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    say(f"[3/4] training for target {target} (half of its training labels), sources "
        f"{', '.join(s for s in sites if s != target)}:")
    run_dirs: dict[str, RunDir] = {}
    n_test = 0
    for method, meaning in METHODS:
        cfg = load_config(data={**data, "method": method})
        run = RunDir(runs / method)
        if run.root.exists():
            shutil.rmtree(run.root)  # the demo always starts afresh
        t0 = time.perf_counter()
        run_experiment(cfg, run, device=device, progress=progress)
        report = evaluate(run, split="test", bootstrap=200 if quick else 500, device=device).report
        n_test = (report["sites"].get(target) or {}).get("n_rows", 0)
        say(f"      {method:<28} {meaning:<38} {time.perf_counter() - t0:5.0f} s")
        run_dirs[method] = run
    say(f"[4/4] comparing on {target}'s test split")
    comparison = compare_runs([r.root for r in run_dirs.values()], baseline=METHODS[0][0],
                              n_boot=200 if quick else 500)
    paths = write_comparison(comparison, out)
    return DemoResult(out, comparison, list(paths), run_dirs, target, n_test, int(data["rounds"]),
                      time.perf_counter() - started)


__all__ = ["DEMO_TARGET", "DemoResult", "METHODS", "demo_config", "run_demo"]
