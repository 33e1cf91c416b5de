"""One AuxInfo+GP round vs one FedAvg_Finetune round on NVIDIA FLARE's simulator (run on demand).

    python benchmarks/bench_flare_round.py [--rounds 3] [--backbone resnet18] [--steps 4]

Two synthetic source hospitals and a target (64 px images, the same optimizer steps of the same
batch size at every site), no validation, all three experiments in one simulator job:

* ``FedAvg_Finetune`` — sources train, the server averages, then the target fine-tunes the
  average: two FLARE round trips one after the other;
* ``AuxInfo_GP (server)`` — ``privacy.combine_at: server`` (the default): sources and target
  train from θ0 in one request, at once; the server projects (a round costs
  max(sources, target) + combine);
* ``AuxInfo_GP (target)`` — ``privacy.combine_at: target``: the target fine-tunes beside the
  sources and holds its model, then receives the source deltas and combines: one more round
  trip (the paper ran sources, then the target, one after the other: 1.12×).

Seconds per round are the server's ``metrics.jsonl`` timings, averaged over rounds ≥ 1
(round 0 includes the sites' start-up). Every site process uses ``--threads`` torch threads.
On a machine with fewer cores than sites, concurrent sites share the cores, so the parallel
round is bounded by the total work over the cores rather than by the slowest site (at real
hospitals every site has its own machine). Results: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SOURCES = ["nih_style", "chexpert_style"]
TARGET = "dicom_style"


def per_round(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = [r["seconds"] for r in rows if r["round"] >= 1] or [rows[0]["seconds"]]
    return sum(later) / len(later)


def config(manifests: Path, cache: Path, args, strategy: str, combine_at: str = "server"):
    from fedcxr.pipeline.config import load_config

    local = {"lr": 1e-3, "batch_size": args.batch_size, "steps": args.steps}
    return load_config(data={
        "name": f"bench-round-{combine_at}", "manifests": str(manifests), "sites": SOURCES, "target": TARGET,
        "strategy": strategy, "rounds": args.rounds, "source": local,
        "target_train": {**local, "lr": 2e-4, "labeled": 1.0},
        "model": {"backbone": args.backbone, "hidden": 128}, "image_size": args.image_size, "augment": False,
        "device": "cpu", "seed": 0, "cache_dir": str(cache), "eval_every": 0,
        "privacy": {"combine_at": combine_at},
    })


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backbone", default="resnet18", choices=["resnet_tiny", "resnet10", "resnet18"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per site process")
    args = parser.parse_args()

    from fedcxr.flare.simulator import simulate_many
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    with tempfile.TemporaryDirectory(prefix="fedcxr-bench-round-") as tmp:
        root = Path(tmp)
        write_synthetic_export(root / "export", sites=[*SOURCES, TARGET], images_per_site=64,
                               image_size=args.image_size, seed=1)
        ingest_synthetic(root / "export", root / "manifests", progress=False)
        m, c = root / "manifests", root / "cache"
        runs = {
            "FedAvg_Finetune": config(m, c, args, "FedAvg_Finetune"),
            "AuxInfo_GP (server)": config(m, c, args, "FedAvg_Finetune_AuxInfo_GP", "server"),
            "AuxInfo_GP (target)": config(m, c, args, "FedAvg_Finetune_AuxInfo_GP", "target"),
        }
        dirs = {name: root / name.replace(" ", "_").replace("(", "").replace(")", "") for name in runs}
        threads = str(args.threads)
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        simulate_many([(cfg, dirs[name]) for name, cfg in runs.items()], progress=False, env=env,
                      flare_dir=root / "flare")
        base = per_round(dirs["FedAvg_Finetune"])
        print(f"{args.backbone}, {args.image_size} px, {args.steps} steps of batch {args.batch_size} per site, "
              f"{args.threads} thread(s) per site, rounds ≥ 1 of {args.rounds}")
        for name in runs:
            seconds = per_round(dirs[name])
            print(f"{name:22s} {seconds:7.2f} s/round  ({seconds / base:4.2f}× FedAvg_Finetune)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
