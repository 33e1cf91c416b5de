"""Round cost of FedAvg_Finetune_AuxInfo_GP vs FedAvg on the same data, side by side.

Goal (issue: the papers' algorithms): an AuxInfo+GP round costs ≤ 1.05× a FedAvg round (the
AuxInfo+GP paper reports 1.12×). Both methods run on the same synthetic federation, the same
network and the same local epochs; the first round of each is a warm-up (cache,
allocator) and the following rounds are timed from ``metrics.jsonl`` (server-side seconds per
round, which include every site's local training and the aggregation).

    python benchmarks/bench_rounds.py [--rounds 4] [--image-size 64] [--backbone resnet18]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.synth import ingest_synthetic, write_synthetic_export


def round_seconds(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["seconds"] for row in rows[1:]]  # round 0 is the warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--images-per-site", type=int, default=400)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--target-labeled", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_synthetic_export(root / "export", images_per_site=args.images_per_site, image_size=args.image_size)
        ingest_synthetic(root / "export", root / "manifests", progress=False)
        base = {
            "manifests": str(root / "manifests"), "sites": ["nih_style", "chexpert_style"],
            "target": "dicom_style", "rounds": args.rounds, "eval_every": 0,
            "source": {"lr": 1e-3, "batch_size": 16, "epochs": 1},
            # few labeled target rows, as in the paper's setting (n_l << source data)
            "target_train": {"lr": 2e-4, "batch_size": 16, "epochs": 1, "labeled": args.target_labeled},
            "model": {"backbone": args.backbone, "hidden": 128}, "image_size": args.image_size,
            "augment": False, "device": args.device, "cache_dir": str(root / "cache"),
        }
        results = {}
        methods = ("FedAvg", "FedAvg_Finetune", "FedAvg_Finetune_AuxInfo_GP")
        for method in methods + methods:  # interleaved twice: drift in machine load hits all alike
            run_dir = root / f"{method}-{len(results.get(method, []))}"
            run_experiment(load_config(data={**base, "strategy": method}), run_dir, progress=False)
            results.setdefault(method, []).extend(round_seconds(run_dir))
    fedavg = statistics.median(results["FedAvg"])
    finetune = statistics.median(results["FedAvg_Finetune"])
    gp = statistics.median(results["FedAvg_Finetune_AuxInfo_GP"])
    print(f"backbone {args.backbone}, {args.image_size}px, {args.images_per_site} images/site, "
          f"{args.target_labeled} labeled target rows, device {args.device}")
    print(f"FedAvg                       median {fedavg:.3f} s/round  (rounds: {results['FedAvg']})")
    print(f"FedAvg_Finetune              median {finetune:.3f} s/round  (rounds: {results['FedAvg_Finetune']})")
    print(f"FedAvg_Finetune_AuxInfo_GP   median {gp:.3f} s/round  (rounds: {results['FedAvg_Finetune_AuxInfo_GP']})")
    print(f"ratio FedAvg_Finetune / FedAvg: {finetune / fedavg:.3f}  (the target's fine-tuning alone)")
    print(f"ratio AuxInfo_GP / FedAvg: {gp / fedavg:.3f}  (goal <= 1.05; paper 1.12)")
    print("note: the AuxInfo+GP round also fine-tunes the target on its few labels (as in the paper's Table 3).")


if __name__ == "__main__":
    main()
