"""Torch threads per training process, on idle and on loaded cores: the data for the thread policy.

Local training (:func:`fedcxr.pipeline.local.train_local` over a cached site dataset, the real
loop) at three sizes — 28 px ``resnet_tiny`` (small stem, PneumoniaMNIST), 64 px ``resnet_tiny``
(the demo) and 224 px ``resnet18`` — each with

* ``1``: one intra-op thread;
* ``N``: torch's default, one per usable core (the behaviour before the thread policy);
* ``N-passive``: the same with ``OMP_WAIT_POLICY=PASSIVE`` (idle OpenMP threads sleep
  instead of spinning — the usual cure for an oversubscribed OpenMP pool);
* ``2x1-parallel``: two processes of one thread each training at once (what training the sites
  of a round in parallel processes would give; images/s summed).

and two machine states, interleaved: ``as is`` (whatever else runs) and ``+L busy``, with
``--load L`` busy-looping processes started by this script (as other jobs on a shared server;
``--load 0``: the as-is state only).
Every measurement runs in a fresh child process (``OMP_WAIT_POLICY`` is read once, at start),
``--repeats`` times, configurations interleaved, the median printed with the load average
before and after. Throughput ratios are read within one machine state.

    python benchmarks/bench_threads.py                         # 3 sizes, load 4, 3 repeats (~10 min)
    python benchmarks/bench_threads.py --sizes 28 --load 2 --repeats 1 --steps 4   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = {  # size → (backbone, stem, batch)
    28: ("resnet_tiny", "small", 64),
    64: ("resnet_tiny", "imagenet", 32),
    224: ("resnet18", "imagenet", 32),
}


def child(size: int, threads: int, steps: int) -> None:
    """Measure ``train_local`` images/s at ``size`` with ``threads`` threads; print one JSON line."""
    sys.path.insert(0, str(REPO))
    import numpy as np
    import pandas as pd
    import torch

    from fedcxr.models.network import CXRNet
    from fedcxr.pipeline.data import SiteDataset, make_loader
    from fedcxr.pipeline.local import LocalConfig, train_local
    from fedcxr.vocab import label_column

    torch.set_num_threads(threads)
    backbone, stem, batch = WORKLOADS[size]
    rng = np.random.default_rng(0)
    n = batch * steps
    images = rng.integers(0, 256, (n, size, size), dtype=np.uint8)
    frame = pd.DataFrame({label_column("pneumonia"): (rng.random(n) < 0.3).astype(float)})
    data = SiteDataset(images, frame, np.arange(n), classes=["pneumonia"], aux_tasks=[], loss_classes=["pneumonia"])
    torch.manual_seed(0)
    model = CXRNet(["pneumonia"], backbone=backbone, hidden=64, stem=stem)
    cfg = LocalConfig(lr=1e-3, batch_size=batch, steps=steps, use_aux=False)
    loader = make_loader(data, batch_size=batch, shuffle=True, seed=0, augment=False)
    train_local(model, loader, LocalConfig(lr=1e-3, batch_size=batch, steps=2, use_aux=False), device="cpu", seed=0)
    started = time.perf_counter()
    result = train_local(model, loader, cfg, device="cpu", seed=0)
    seconds = time.perf_counter() - started
    print(json.dumps({"img_s": result.samples_seen / seconds, "threads": torch.get_num_threads()}))


def run_child(size: int, threads: int, steps: int, passive: bool = False) -> float:
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(key, None)  # the child sets its own count
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        env.pop("OMP_WAIT_POLICY", None)
    out = subprocess.run([sys.executable, __file__, "--child", str(size), str(threads), str(steps)],
                         capture_output=True, text=True, env=env, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["img_s"])


def run_parallel(size: int, steps: int, processes: int = 2) -> float:
    """``processes`` one-thread children at once (as sites trained in parallel): summed images/s."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    procs = [subprocess.Popen([sys.executable, __file__, "--child", str(size), "1", str(steps)],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(processes)]
    rates = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"child exited {proc.returncode}")
        rates.append(float(json.loads(out.strip().splitlines()[-1])["img_s"]))
    return sum(rates)


class BusyLoad:
    """``n`` processes spinning on a core each (other jobs on a shared machine)."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self) -> "BusyLoad":
        # each spins until this script ends, even when it is killed (the loop checks its parent)
        spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(self.n)]
        time.sleep(0.5 if self.n else 0)
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[28, 64, 224], choices=sorted(WORKLOADS))
    parser.add_argument("--load", type=int, default=4, help="busy processes of the loaded state (0: no loaded state)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps per measurement")
    parser.add_argument("--variants", nargs="+", default=None,
                        help="subset of: 1 N N-passive 2x1-parallel (N = usable cores; default all)")
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return {}
    cores = usable_cores()
    variants = ["1", f"{cores}", f"{cores}-passive", "2x1-parallel"]
    if args.variants:
        wanted = [v.replace("N", str(cores)) for v in args.variants]
        variants = ["1"] + [v for v in variants if v in wanted and v != "1"]  # "1" is every ratio's base
    states = [("as is", 0)] + ([(f"+{args.load} busy", args.load)] if args.load > 0 else [])
    results: dict = {}
    print(f"{cores} usable cores; load average at start {os.getloadavg()}")
    for repeat in range(args.repeats):
        for state, load in states:
            with BusyLoad(load):
                for size in args.sizes:
                    for variant in variants:
                        if variant == "2x1-parallel":
                            rate = run_parallel(size, args.steps)
                        else:
                            rate = run_child(size, int(variant.split("-")[0]), args.steps, variant.endswith("passive"))
                        results.setdefault((state, size, variant), []).append(rate)
                print(f"  repeat {repeat + 1}, {state}: load average {os.getloadavg()[0]:.1f}", flush=True)
    print(f"load average at end {os.getloadavg()}")
    print(f"\ntrain_local images/s, median of {args.repeats} (ratio to 1 thread in the same state)")
    header = f"{'state':<12} {'size':>5} " + " ".join(f"{v:>20}" for v in variants)
    print(header)
    table = {}
    for state, _ in states:
        for size in args.sizes:
            base = statistics.median(results[(state, size, "1")])
            cells = []
            for variant in variants:
                value = statistics.median(results[(state, size, variant)])
                table[(state, size, variant)] = value
                cells.append(f"{value:9.1f} ({value / base:4.2f}x)")
            print(f"{state:<12} {size:>5} " + " ".join(f"{c:>20}" for c in cells))
    return table


if __name__ == "__main__":
    main()
