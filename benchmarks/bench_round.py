"""A FedAvg round in fedcxr against a hand-written PyTorch floor and Flower's simulation.

The same federation for all three: ``--sites`` synthetic hospitals (``fedcxr synth``, ingested),
``--size`` px, the same network (:class:`fedcxr.models.network.CXRNet`, ``--backbone``), the
same training rows of each site, ``--steps`` Adam steps of ``--batch-size`` per site and round
(fresh Adam each round, as fedcxr's FedAvg), sample-weighted FedAvg, one torch thread per
process (fedcxr's thread policy), no augmentation, no validation.

* ``fedcxr``: :func:`fedcxr.pipeline.run_driver.run_experiment` (strategy FedAvg, in-process
  transport, checkpoints and metrics written every round) — seconds per round from
  ``metrics.jsonl``;
* ``floor``: a hand-written loop over the same images already normalised as float tensors in
  memory: per round and site load the global weights, ``randperm`` batches, masked BCE, Adam,
  then average the state dicts — the least any framework can do;
* ``Flower``: Flower's simulation engine (``flwr.simulation.run_simulation``, Ray backend, one
  CPU per client, FedAvg strategy, ``NumPyClient`` running the floor's training step) — seconds
  per round from the strategy's ``configure_fit`` → ``aggregate_fit``, plus its start-up.
  Flower is never a fedcxr dependency: it runs in a separate interpreter given by
  ``--flower-python`` (default ``.flower-venv/bin/python``; create it with
  ``python -m venv .flower-venv && .flower-venv/bin/pip install "flwr[simulation]"``);
  the child appends this interpreter's site-packages for torch. Without it Flower is skipped
  with a message.

Round 0 of each (caches, allocator, Ray actors) is a warm-up and not counted; the three run
interleaved ``--repeats`` times and the medians are compared (goal: fedcxr ≤ 1.05× the floor).

    python benchmarks/bench_round.py                      # 3 sites, 28 px resnet_tiny, 4 rounds
    python benchmarks/bench_round.py --size 224 --backbone resnet18 --steps 4 --batch-size 16
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SITES = ["nih_style", "chexpert_style", "dicom_style", "midrc_style"]
DEFAULT_FLOWER = REPO / ".flower-venv" / "bin" / "python"  # its own environment, never a fedcxr dependency


# --------------------------------------------------------------------------- the shared federation


def build(root: Path, args) -> dict:
    """Ingest the synthetic sites, build their caches; the floor's arrays (per site) as .npz."""
    from fedcxr.pipeline.data import make_dataset, load_site
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    sites = SITES[: args.sites]
    write_synthetic_export(root / "export", sites=sites, images_per_site=args.images_per_site, image_size=64, seed=0)
    ingest_synthetic(root / "export", root / "manifests", progress=False)
    classes = sorted({c for s in sites for c in load_site(root / "manifests" / s).class_set})
    from fedcxr.vocab import CLASSES

    classes = [c for c in CLASSES if c in classes]
    arrays = {}
    for name in sites:
        site = load_site(root / "manifests" / name)
        data = make_dataset(site, "train", classes=classes, aux_tasks=[], image_size=args.size,
                            cache_dir=root / "cache", augment=False, progress=False)
        batch = data.fetch(np.arange(len(data)))
        arrays[f"{name}__x"] = batch["pixels"].numpy()
        arrays[f"{name}__y"] = batch["label"].numpy()
        arrays[f"{name}__m"] = batch["label_mask"].numpy()
    np.savez(root / "floor.npz", **arrays)
    return {"sites": sites, "classes": classes}


def experiment(root: Path, fed: dict, args) -> dict:
    return {
        "name": "bench-round", "manifests": str(root / "manifests"), "sites": fed["sites"], "strategy": "FedAvg",
        "rounds": args.rounds, "eval_every": 0, "augment": False, "device": "cpu", "seed": 0,
        "source": {"lr": 1e-3, "batch_size": args.batch_size, "steps": args.steps},
        "model": {"backbone": args.backbone, "hidden": 64, "classes": fed["classes"]},
        "image_size": args.size, "cache_dir": str(root / "cache"),
    }


def run_fedcxr(root: Path, fed: dict, args, repeat: int) -> list[float]:
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment

    run_dir = root / f"fedcxr-{repeat}"
    run_experiment(load_config(data=experiment(root, fed, args)), run_dir, progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["seconds"] for row in rows[1:]]


# --------------------------------------------------------------------------- the floor (also Flower's client step)


def load_floor(npz: Path, sites: list[str]):
    import torch

    data = np.load(npz)
    out = {}
    for name in sites:
        x = torch.from_numpy(data[f"{name}__x"]).float().mul_(1 / 255).sub_(0.5).div_(0.25)
        out[name] = (x, torch.from_numpy(data[f"{name}__y"]), torch.from_numpy(data[f"{name}__m"]))
    return out


def local_steps(model, x, y, m, steps: int, batch_size: int, seed: int) -> None:
    """``steps`` Adam steps of masked BCE on ``randperm`` batches (cycling) from in-memory tensors."""
    import torch
    import torch.nn.functional as F

    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=generator)
    for step in range(steps):
        start = (step * batch_size) % max(1, len(x) - batch_size + 1)
        idx = order[start:start + batch_size]
        logits = model(x[idx])["main"]
        loss = F.binary_cross_entropy_with_logits(logits, y[idx], reduction="none")
        loss = (loss * m[idx]).sum() / m[idx].sum().clamp_min(1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def make_model(fed: dict, args):
    import torch

    from fedcxr.models.network import CXRNet

    torch.manual_seed(0)
    return CXRNet(fed["classes"], backbone=args.backbone, hidden=64)


def run_floor(root: Path, fed: dict, args) -> list[float]:
    import torch

    data = load_floor(root / "floor.npz", fed["sites"])
    model = make_model(fed, args)
    theta = {k: v.clone() for k, v in model.state_dict().items()}
    seconds = []
    for r in range(args.rounds):
        started = time.perf_counter()
        states, weights = [], []
        for k, name in enumerate(fed["sites"]):
            x, y, m = data[name]
            model.load_state_dict(theta)
            local_steps(model, x, y, m, args.steps, args.batch_size, seed=1000 * r + k)
            states.append({key: v.detach().clone() for key, v in model.state_dict().items()})
            weights.append(len(x))
        total = float(sum(weights))
        theta = {key: (sum(s[key].double() * (w / total) for s, w in zip(states, weights))).to(theta[key].dtype)
                 for key in theta}
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


# --------------------------------------------------------------------------- Flower


def flower_child(root: Path, fed: dict, args) -> None:
    """Runs inside Flower's interpreter: the floor's step as a NumPyClient, FedAvg, Ray simulation."""
    import torch
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    torch.set_num_threads(1)
    sites = fed["sites"]
    keys = list(make_model(fed, args).state_dict())
    times: list[tuple[str, int, float]] = []

    class Client(NumPyClient):
        def __init__(self, name: str):
            self.name = name
            self.data = load_floor(root / "floor.npz", [name])[name]
            self.model = make_model(fed, args)

        def fit(self, parameters, config):
            torch.set_num_threads(1)
            state = {k: torch.from_numpy(np.array(v)) for k, v in zip(keys, parameters)}
            self.model.load_state_dict(state)
            x, y, m = self.data
            local_steps(self.model, x, y, m, args.steps, args.batch_size, seed=int(config.get("round", 0)))
            return [v.detach().numpy() for v in self.model.state_dict().values()], len(x), {}

    def client_fn(context: Context):
        return Client(sites[int(context.node_config["partition-id"])]).to_client()

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            times.append(("start", server_round, time.perf_counter()))
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            times.append(("end", server_round, time.perf_counter()))
            return out

    initial = ndarrays_to_parameters([v.numpy() for v in make_model(fed, args).state_dict().values()])
    strategy = TimedFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=len(sites),
                           min_available_clients=len(sites), initial_parameters=initial,
                           on_fit_config_fn=lambda r: {"round": r})

    def server_fn(context: Context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=args.rounds))

    started = time.perf_counter()
    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                   num_supernodes=len(sites), backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0}})
    total = time.perf_counter() - started
    starts = {r: t for kind, r, t in times if kind == "start"}
    ends = {r: t for kind, r, t in times if kind == "end"}
    rounds = [ends[r] - starts[r] for r in sorted(ends) if r in starts]
    print(json.dumps({"rounds": rounds[1:], "first": rounds[0] if rounds else float("nan"), "total": total}))


def run_flower(root: Path, fed: dict, args) -> dict | None:
    python = Path(args.flower_python)
    probe = subprocess.run([str(python), "-c", "import flwr.simulation, ray"], capture_output=True) \
        if python.exists() else None
    if probe is None or probe.returncode:
        return None
    import torch

    env = dict(os.environ, FEDCXR_TORCH_PATH=str(Path(torch.__file__).parents[1]), OMP_NUM_THREADS="1")
    cmd = [str(python), __file__, "--flower-child", str(root), json.dumps(fed)] + args.argv
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        print(f"Flower run failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- main


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=3, choices=[2, 3, 4])
    parser.add_argument("--images-per-site", type=int, default=200)
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--backbone", default="resnet_tiny")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run; the first is a warm-up")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--flower-python", default=str(DEFAULT_FLOWER))
    parser.add_argument("--skip-flower", action="store_true")
    parser.add_argument("--flower-child", nargs=2, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)
    args.argv = [a for a in (argv if argv is not None else sys.argv[1:])]
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    if args.flower_child:
        sys.path.append(os.environ["FEDCXR_TORCH_PATH"])  # after Flower's own packages
        child_args = [a for a in args.argv if a not in args.flower_child and a != "--flower-child"]
        sub = parse(child_args)
        flower_child(Path(args.flower_child[0]), json.loads(args.flower_child[1]), sub)
        return {}
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compare(args)
    finally:
        torch.set_num_threads(previous)


def _compare(args) -> dict:
    print(f"{args.sites} sites, {args.size} px {args.backbone}, {args.steps} steps of {args.batch_size} per site "
          f"and round, {args.rounds} rounds (first = warm-up), 1 thread; load average {os.getloadavg()}")
    results: dict[str, list[float]] = {"fedcxr": [], "floor": [], "Flower": []}
    flower_startup: list[tuple[float, float]] = []
    fedcxr_total: list[float] = []
    with tempfile.TemporaryDirectory(prefix="fedcxr-bench-round-") as tmp:
        root = Path(tmp)
        fed = build(root, args)
        flower_missing = args.skip_flower
        for repeat in range(args.repeats):
            started = time.perf_counter()
            results["fedcxr"] += run_fedcxr(root, fed, args, repeat)
            fedcxr_total.append(time.perf_counter() - started)
            results["floor"] += run_floor(root, fed, args)
            if not flower_missing:
                flower = run_flower(root, fed, args)
                if flower is None:
                    flower_missing = True
                    print(f"Flower skipped: no interpreter with flwr[simulation] at {args.flower_python} (create one "
                          "with `python -m venv .flower-venv && .flower-venv/bin/pip install 'flwr[simulation]'`; "
                          "Flower is never a fedcxr dependency)")
                else:
                    results["Flower"] += flower["rounds"]
                    flower_startup.append((flower["first"], flower["total"]))
            print(f"  repeat {repeat + 1}: load average {os.getloadavg()[0]:.1f}", flush=True)
    medians = {k: statistics.median(v) for k, v in results.items() if v}
    print(f"load average at end {os.getloadavg()}")
    for name, value in medians.items():
        print(f"{name:<8} median {value:.3f} s/round   (rounds: {', '.join(f'{v:.3f}' for v in results[name])})")
    ratios = {"fedcxr / floor": medians["fedcxr"] / medians["floor"]}
    if "Flower" in medians:
        ratios["Flower / floor"] = medians["Flower"] / medians["floor"]
        print("Flower round 1 (Ray actors start) / whole simulation: "
              + ", ".join(f"{first:.1f} / {total:.1f} s" for first, total in flower_startup)
              + f"; fedcxr whole run: {', '.join(f'{t:.1f}' for t in fedcxr_total)} s")
    for name, value in ratios.items():
        print(f"ratio {name}: {value:.3f}")
    print("goal: fedcxr / floor <= 1.05")
    return {"medians": medians, "ratios": ratios}


if __name__ == "__main__":
    main()
