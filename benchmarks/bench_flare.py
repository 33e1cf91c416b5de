"""Per-round cost of NVIDIA FLARE vs the in-process transport (run on demand, not in tests).

    python benchmarks/bench_flare.py [--rounds 4] [--modes simulator poc] [--models resnet_tiny densenet121]

The same FedAvg experiment (two synthetic hospitals, 32 px images, one optimizer step of
batch 8 per site per round, no validation) runs in-process (``fedcxr train``), in FLARE's
simulator and in POC mode (mTLS on loopback). Seconds per round are the server's own
``metrics.jsonl`` timings (send θ to both sites, both train, replies back, FedAvg), averaged
over rounds ≥ 1 (round 0 includes the sites' start-up). Two payloads:

* ``resnet_tiny`` — the tests' network (~0.08 M parameters, 0.3 MB);
* ``densenet121`` — the DenseNet121 of the papers (7.2 M parameters, 28.7 MB float32).

Job start-up (FLARE launching server and clients, sites importing torch/MONAI) is reported
separately: wall time of the whole run minus the rounds.

Measured on the 2-core development VM (rounds=4, one run, shared machine):

    model        payload   in-process   simulator              POC (mTLS, loopback)
    resnet_tiny   0.3 MB     0.11 s      1.14 s (10.8×, +1.04 s)  1.15 s (10.8×, +1.04 s)
    densenet121  28.7 MB     0.29 s      2.03 s ( 7.1×, +1.75 s)  2.54 s ( 8.9×, +2.26 s)
    start-up (whole run minus its rounds): in-process ~1 s, simulator ~15 s, POC ~40 s

FLARE adds ~1 s per round trip whatever the payload: fixed polling in FLARE 2.9 (the
in-process Client API executor polls for the trainer's result every 0.5 s, the server checks
its tasks every 0.1 s, idle clients ask for work every 0.05 s — fedcxr lowers FLARE's default
of 2 s). A DenseNet121-size model adds ~0.7 s (simulator) to ~1.2 s (POC: TLS) per round for two
sites, both directions. Real rounds train for minutes per site, so the overhead stays small.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_round(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = [r["seconds"] for r in rows if r["round"] >= 1] or [rows[0]["seconds"]]
    return sum(later) / len(later)


def config(manifests: Path, cache: Path, backbone: str, rounds: int):
    from fedcxr.pipeline.config import load_config

    return load_config(data={
        "name": f"bench-{backbone}", "manifests": str(manifests), "sites": ["nih_style", "chexpert_style"],
        "strategy": "FedAvg", "rounds": rounds, "source": {"lr": 1e-3, "batch_size": 8, "steps": 1},
        "model": {"backbone": backbone, "hidden": 128 if backbone == "densenet121" else 16},
        "image_size": 32, "augment": False, "device": "cpu", "seed": 0, "cache_dir": str(cache), "eval_every": 0,
    })


def run(mode: str, cfg, run_dir: Path) -> tuple[float, float]:
    """(seconds per round, start-up seconds) of one mode."""
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.flare.poc import poc
    from fedcxr.flare.simulator import simulate

    start = time.perf_counter()
    if mode == "in-process":
        run_experiment(cfg, run_dir, progress=False)
    elif mode == "simulator":
        simulate(cfg, run_dir, progress=False)
    else:
        poc(cfg, run_dir, progress=False)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return per_round(run_dir), wall - sum(r["seconds"] for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=["simulator", "poc"], choices=["simulator", "poc"])
    parser.add_argument("--models", nargs="+", default=["resnet_tiny", "densenet121"],
                        choices=["resnet_tiny", "resnet18", "densenet121"])
    args = parser.parse_args()

    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    with tempfile.TemporaryDirectory(prefix="fedcxr-bench-flare-") as tmp:
        root = Path(tmp)
        write_synthetic_export(root / "export", sites=["nih_style", "chexpert_style"], images_per_site=48,
                               image_size=32, seed=1)
        ingest_synthetic(root / "export", root / "manifests", progress=False)
        rows = []
        for backbone in args.models:
            cfg = config(root / "manifests", root / "cache", backbone, args.rounds)
            results = {}
            for mode in ["in-process", *args.modes]:
                results[mode] = run(mode, cfg, root / f"{backbone}-{mode}")
                print(f"{backbone:12s} {mode:10s} {results[mode][0]:6.2f} s/round  start-up {results[mode][1]:5.1f} s",
                      flush=True)
            rows.append((backbone, results))
        print()
        print(f"{'model':12s} {'in-process':>12s}" + "".join(f" {m:>22s}" for m in args.modes))
        for backbone, results in rows:
            base = results["in-process"][0]
            cells = "".join(f" {results[m][0]:8.2f} s ({results[m][0] / base:4.1f}×, +{results[m][0] - base:4.2f})"
                            for m in args.modes)
            print(f"{backbone:12s} {base:10.2f} s" + cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
