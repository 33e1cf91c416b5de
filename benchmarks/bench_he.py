"""What secure aggregation (``privacy.secure_aggregation: he``) costs per round on NVIDIA FLARE's simulator (on demand).

    python benchmarks/bench_he.py [--backbone resnet18] [--image-size 64] [--rounds 3] [--steps 4] [--sites 3]

Part 1, the FLARE simulator: FedAvg over ``--sites`` synthetic hospitals, the same experiment plain
and sealed, in one simulator job (both with the value checks of ``defences:`` off, which secure
aggregation requires, so the two runs differ only in the encryption). Reported: seconds per round
(the server's ``metrics.jsonl`` timings, rounds ≥ 1: round 0 includes the sites' start-up), the
sites' own sealing and opening times (``he_seconds`` of their replies), and how far the sealed run's
final model is from the plain one.

Part 2, no FLARE: the same model sealed as fedcxr packs it (one vector) and as NVIDIA FLARE's
``HEModelEncryptor`` would (one CKKS vector per state-dict entry, each shipped by FLARE's FOBS
decomposer with its context), bytes per reply; and the server's FedAvg on ciphertexts against the
plain ``aggregate.fedavg`` (seconds, and the largest difference). Results: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SITES = ["nih_style", "chexpert_style", "midrc_style", "dicom_style"]
BLIND = {"norm_factor": None, "norm_limit": None, "bn_factor": None, "check_variance": False}


def per_round(run_dir: Path) -> tuple[float, dict]:
    """Mean seconds of rounds ≥ 1 and the sites' mean ``he_seconds`` (open, seal) over them."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = [r for r in rows if r["round"] >= 1] or rows
    he = [m["he_seconds"] for r in later for m in r["train"].values() if "he_seconds" in m]
    sites = {part: statistics.mean(h[part] for h in he) for part in ("open", "seal")} if he else {}
    return statistics.mean(r["seconds"] for r in later), sites


def config(manifests: Path, cache: Path, args, sealed: bool):
    from fedcxr.pipeline.config import load_config

    return load_config(data={
        "name": f"bench-he-{'sealed' if sealed else 'plain'}", "manifests": str(manifests),
        "sites": SITES[:args.sites], "strategy": "FedAvg", "rounds": args.rounds,
        "source": {"lr": 1e-3, "batch_size": args.batch_size, "steps": args.steps, "optimizer": "sgd",
                   "momentum": 0.0},
        "model": {"backbone": args.backbone, "hidden": 128}, "image_size": args.image_size, "augment": False,
        "device": "cpu", "seed": 0, "cache_dir": str(cache), "eval_every": 0, "defences": BLIND,
        "privacy": {"secure_aggregation": "he" if sealed else None},
    })


def relative_gap(a: dict, b: dict) -> float:
    return max(float(((a[k].double() - b[k].double()).abs() / (1 + b[k].double().abs())).max()) for k in a
               if a[k].numel())


def flare_part(args, root: Path) -> None:
    import torch

    from fedcxr.flare.simulator import simulate_many
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    write_synthetic_export(root / "export", sites=SITES[:args.sites], images_per_site=64,
                           image_size=args.image_size, seed=1)
    ingest_synthetic(root / "export", root / "manifests", progress=False)
    runs = {name: config(root / "manifests", root / "cache", args, name == "sealed") for name in ("plain", "sealed")}
    threads = str(args.threads)
    simulate_many([(cfg, root / name) for name, cfg in runs.items()], progress=False, flare_dir=root / "flare",
                  env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}, evaluation={"enabled": False})
    plain, _ = per_round(root / "plain")
    sealed, sites = per_round(root / "sealed")
    finals = {n: torch.load(root / n / "final_model.pt", weights_only=True)["global"] for n in runs}
    gap = relative_gap(finals["sealed"], finals["plain"])
    print(f"FLARE simulator: FedAvg, {args.sites} sites, {args.backbone} at {args.image_size} px, {args.steps} SGD "
          f"steps of batch {args.batch_size} per site, {args.threads} thread(s) per site, rounds ≥ 1 of {args.rounds}")
    print(f"  plain  {plain:7.2f} s/round")
    print(f"  sealed {sealed:7.2f} s/round  ({sealed / plain:4.2f}× plain); at each site per round: open "
          f"{sites.get('open', 0):.2f} s, seal {sites.get('seal', 0):.2f} s")
    print(f"  final models: max |sealed − plain| / (1 + |plain|) = {gap:.2e}")


def packing_part(args) -> None:
    import torch

    from fedcxr.flare.he_keys import CLIENT_CONTEXT, SERVER_CONTEXT, read_context_file, rehearsal_keys
    from fedcxr.flare.sealing import data_key, open_sealed, seal
    from fedcxr.flare.secure_aggregation import SealedAggregation
    from fedcxr.models.network import network_from_config
    from fedcxr.pipeline import aggregate as agg

    with tempfile.TemporaryDirectory() as tmp:
        keys = rehearsal_keys(Path(tmp) / "he")
        client = read_context_file(keys / CLIENT_CONTEXT, private=True)
        server = read_context_file(keys / SERVER_CONTEXT, private=False)
    torch.manual_seed(0)
    model = network_from_config(["cardiomegaly", "edema", "pneumonia"], {"backbone": args.backbone, "hidden": 128}, {})
    theta = {k: v.detach().clone() for k, v in model.state_dict().items()}
    n_values = sum(v.numel() for v in theta.values())
    plain_bytes = sum(v.numel() * v.element_size() for v in theta.values())
    states = [{k: (v + 1e-3 * torch.randn_like(v) if v.is_floating_point() else v) for k, v in theta.items()}
              for _ in range(args.sites)]
    start = time.perf_counter()
    sealed = [seal(s, client) for s in states]
    seal_s = (time.perf_counter() - start) / len(states)
    packed = sum(t.numel() for t in sealed[0].values())
    per_entry = flare_style_bytes(theta, client)
    weights = [float(10 + 5 * i) for i in range(args.sites)]
    start = time.perf_counter()
    merged = SealedAggregation(server).weighted_mean(theta, {f"s{i}": s for i, s in enumerate(sealed)}, weights)
    mean_s = time.perf_counter() - start
    start = time.perf_counter()
    opened = open_sealed(merged, client)
    open_s = time.perf_counter() - start
    plain = agg.fedavg(states, weights)
    gap = max(float((opened[k].double() - plain[k].double()).abs().max()) for k in plain if plain[k].numel())
    print(f"no FLARE: {args.backbone}, {len(theta)} entries, {n_values:,} values ({plain_bytes / 2**20:.2f} MiB float32)")
    print(f"  a site's sealed reply, packed (fedcxr): {packed / 2**20:8.2f} MiB ({packed / plain_bytes:5.1f}× plain), "
          f"seal {seal_s:.2f} s")
    print(f"  one CKKS vector per entry + its context (FLARE's HEModelEncryptor + FOBS): {per_entry / 2**20:8.2f} MiB "
          f"({per_entry / packed:4.1f}× packed)")
    print(f"  server: FedAvg of {args.sites} sealed replies {mean_s:.2f} s, the mean's size "
          f"{merged[data_key('model')].numel() / 2**20:.2f} MiB; a site opens it in {open_s:.2f} s")
    print(f"  max |sealed FedAvg − aggregate.fedavg| = {gap:.2e} (float32 FedAvg vs CKKS)")


def flare_style_bytes(theta: dict, client) -> int:
    """Bytes of ``theta`` as FLARE's filter sends it: a CKKS vector per entry, each decomposed by FLARE's
    ``CKKSVectorDecomposer`` into (vector, context) for the message."""
    import tenseal as ts
    from nvflare.app_opt.he.decomposers import CKKSVectorDecomposer

    decomposer = CKKSVectorDecomposer()
    total = 0
    for value in theta.values():
        vector = ts.ckks_vector(client, value.double().reshape(-1).numpy())
        data, context = decomposer.decompose(vector)
        total += len(data) + len(context)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="resnet_tiny", choices=["resnet_tiny", "resnet10", "resnet18"])
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sites", type=int, default=3, choices=[2, 3, 4])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per site process")
    parser.add_argument("--no-flare", action="store_true", help="part 2 only")
    args = parser.parse_args()
    packing_part(args)
    if not args.no_flare:
        with tempfile.TemporaryDirectory(prefix="fedcxr-bench-he-") as tmp:
            flare_part(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
