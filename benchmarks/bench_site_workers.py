"""``engine.site_workers``: the round's sites trained one after another vs in parallel worker processes.

The demo's federation (``fedcxr demo``: four synthetic hospitals, 500 images each, 64 px
``resnet_tiny``, augmentation on, one epoch per site and round) trained with the demo's
``FedAvg_Finetune`` config for ``--rounds`` rounds, once per ``--workers`` setting (0: every site
in the main process, the default; N: ``engine.site_workers: N``). Each run is a fresh
``fedcxr train`` process, timed from start to exit, so a parallel run pays its fork server and
workers' start-up as a user would. The settings run interleaved ``--repeats`` times (caches
decoded once before); the script prints the median wall time and median seconds per round
(rounds ≥ 1, from ``metrics.jsonl``), the load average around each run, and checks that every
run ended with the same weights.

    python benchmarks/bench_site_workers.py                       # 0 vs 2 workers, 3 rounds, 3 repeats
    python benchmarks/bench_site_workers.py --rounds 2 --repeats 2 --images-per-site 200   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build(root: Path, args) -> dict:
    """Synthesise and ingest the demo's hospitals; the demo's FedAvg_Finetune config for them."""
    from fedcxr.workflows.demo import DEMO_TARGET, demo_config
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    write_synthetic_export(root / "export", images_per_site=args.images_per_site, image_size=64, seed=0)
    sites = sorted(Path(d).name for d in ingest_synthetic(root / "export", root / "manifests", progress=False).values())
    data = demo_config(root / "manifests", sites, DEMO_TARGET, quick=False)
    data.update(rounds=args.rounds, device="cpu", num_workers=0)
    return data


def train(root: Path, data: dict, workers: int, tag: str) -> dict:
    """One ``fedcxr train`` process; its wall time, seconds per round and final weights' path."""
    config = root / f"{tag}.yaml"
    config.write_text(yaml.safe_dump({**data, "engine": {"site_workers": workers}}))
    out = root / "runs" / tag
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedcxr.cli", "train", str(config), "--out", str(out), "--quiet"],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"wall": wall, "round": statistics.median(r["seconds"] for r in rows[1:]) if len(rows) > 1 else None,
            "final": out / "final_model.pt", "load": (load, os.getloadavg()[0])}


def same_weights(a: Path, b: Path) -> bool:
    import torch

    x = torch.load(a, map_location="cpu", weights_only=True)["global"]
    y = torch.load(b, map_location="cpu", weights_only=True)["global"]
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images-per-site", type=int, default=500)
    args = parser.parse_args()
    print(f"{len(os.sched_getaffinity(0))} usable cores; load average at start {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-site-workers-") as tmp:
        root = Path(tmp)
        data = build(root, args)
        train(root, {**data, "rounds": 1}, 0, "warm-up")  # decodes the caches, not counted
        results: dict[int, list[dict]] = {w: [] for w in args.workers}
        for repeat in range(args.repeats):
            for w in (args.workers if repeat % 2 == 0 else args.workers[::-1]):  # interleaved, alternating order
                res = train(root, data, w, f"w{w}-r{repeat}")
                results[w].append(res)
                print(f"  repeat {repeat + 1}, site_workers {w}: {res['wall']:.1f} s, {res['round']:.2f} s/round "
                      f"(load {res['load'][0]:.1f} -> {res['load'][1]:.1f})", flush=True)
        first = results[args.workers[0]][0]["final"]
        identical = all(same_weights(first, r["final"]) for rs in results.values() for r in rs)
        base = args.workers[0]
        print(f"\n{args.rounds} rounds of the demo's FedAvg_Finetune ({args.images_per_site} images per site, 64 px, "
              f"augmented), medians of {args.repeats}:")
        for w, rs in results.items():
            wall = statistics.median(r["wall"] for r in rs)
            per_round = statistics.median(r["round"] for r in rs)
            ref_wall = statistics.median(r["wall"] for r in results[base])
            ref_round = statistics.median(r["round"] for r in results[base])
            print(f"  site_workers {w}: {wall:6.1f} s per run ({wall / ref_wall:.2f}x), {per_round:5.2f} s per round "
                  f"({per_round / ref_round:.2f}x)")
        print(f"every run ended with the same weights: {identical}; load average at end {os.getloadavg()}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
