"""A hundred sites cost no more than five: the same images dealt to N sites, timed and measured side by side.

PneumoniaMNIST (``pneumoniamnist_merged.npz``) is ingested with ``--site-by iid:N`` for every N
of ``--sites`` (5, 50, 100 by default: the same 5,835 images in every case) and trained with
FedAvg, ``resnet_tiny`` at 28 px, one epoch of batches of 64 per site and round, every site
validated every round — the setting issue 31 measured. Each run is a fresh process (``--child``)
that reports, from inside:

* ``start-up``: process start to the first round (imports, every site's manifest and metadata,
  the image caches — decoded in the first repeat, which starts from an empty cache folder);
* ``first round`` and the ``steady`` round (median of rounds ≥ 1), wall seconds as ``metrics.jsonl``
  records them, and the process's CPU seconds over the same spans (less sensitive to the other
  jobs of a shared machine than wall time);
* ``peak RSS`` (``getrusage(RUSAGE_SELF).ru_maxrss`` at exit: the whole process, imports included);
* the longest round line of ``train.log`` in characters;
* the **training floor** (``--floor-only`` runs it alone): the same batches in plain PyTorch — for every
  site its train rows in batches of 64, a fresh Adam (as FedAvg's sites start each round), forward,
  BCE, backward, step on one thread as fedcxr's runs — with none of fedcxr's code, timed for each N
  side by side in one child process. Its ratio is what the training itself costs at N sites: the
  part of a steady round no per-site saving in fedcxr can remove (at 28 px a step's cost is mostly
  PyTorch's per-operator overhead, so 100 steps of ~47 images cost more than 75 of 64).

The Ns run back to back in every repeat (alternating order), ``--repeats`` times; the table gives
medians and each ratio to the first N, with the load average before and after.

    python benchmarks/bench_scale.py                                  # 5, 50, 100 sites, 4 rounds, 3 repeats
    python benchmarks/bench_scale.py --sites 5 100 --rounds 3 --repeats 2 --work runs/scale   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

START = time.time()
REPO = Path(__file__).resolve().parents[1]
#: ``../shared`` beside the checkout, or ``$FEDCXR_SHARED`` (as the tests' ``shared_data``)
DEFAULT_INPUT = (Path(os.environ["FEDCXR_SHARED"]) if os.environ.get("FEDCXR_SHARED") else REPO.parent / "shared") \
    / "data" / "medmnist" / "pneumoniamnist_merged.npz"


def config(manifests: Path, n: int, rounds: int, cache: Path, method: str) -> dict:
    """FedAvg over every site of an ``iid:n`` ingest (issue 31's setting)."""
    return {
        "name": f"scale-{n}", "manifests": str(manifests), "sites": [f"site-{i}" for i in range(1, n + 1)],
        "method": method, "rounds": rounds, "source": {"lr": 1e-3, "batch_size": 64, "epochs": 1},
        "model": {"backbone": "resnet_tiny", "hidden": 64}, "image_size": 28, "augment": False,
        "device": "cpu", "seed": 0, "cache_dir": str(cache), "eval_every": 1,
    }


def ingest(source: Path, work: Path, n: int) -> Path:
    out = work / f"iid{n}"
    if not (out / "ingest_report.json").is_file():
        subprocess.run([sys.executable, "-m", "fedcxr.cli", "ingest", "medmnist", "--input", str(source),
                        "--site-by", f"iid:{n}", "--out", str(out)], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
    return out


def child(config_path: Path, out: Path) -> int:
    """One training run in this process; prints a JSON line of what it measured."""
    import resource

    import yaml

    from fedcxr.pipeline import run_driver
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_log import run_log  # noqa: F401  (imported before timing, as train does)

    marks: dict = {"starts": [], "ends": []}
    write = run_driver.write_metrics

    def timed_write(run_dir, rows):  # called once after every round's validation (where its `seconds` end)
        marks["ends"].append(time.process_time())
        return write(run_dir, rows)

    run_driver.write_metrics = timed_write
    original = run_driver.get_protocol

    def protocol(name):
        proto = original(name)
        run_round = proto.run_round

        def first(ctx, r, state):
            marks.setdefault("round0", time.time())
            marks["starts"].append(time.process_time())
            return run_round(ctx, r, state)

        proto.run_round = first
        return proto

    run_driver.get_protocol = protocol
    cfg = load_config(data=yaml.safe_load(config_path.read_text()))
    run_driver.run_experiment(cfg, out, progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    cpu = [b - a for a, b in zip(marks["starts"], marks["ends"])]
    lines = [len(m.group(1)) for m in re.finditer(r"fedcxr\.rounds: (round \d+/\d+.*)$",
                                                   (out / "train.log").read_text(), re.M)]
    print(json.dumps({"startup": marks["round0"] - START, "rounds": [r["seconds"] for r in rows], "cpu": cpu,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "line_chars": max(lines) if lines else 0, "total": time.time() - START}))
    return 0


def child_json(args: list[str], what: str) -> dict:
    """This script run again with ``args`` in a fresh process; the JSON of its last stdout line."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], cwd=REPO, capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def train_sizes(manifests: Path, n: int) -> list[int]:
    """Each site's train rows in an ``iid:n`` ingest (the batches a site's epoch makes)."""
    import pandas as pd

    return [int((pd.read_parquet(manifests / f"site-{i}" / "manifest.parquet", columns=["split"])["split"]
                 == "train").sum()) for i in range(1, n + 1)]


def floor_child(sizes_path: Path, repeats: int) -> int:
    """The training floor (module docstring): prints ``{n: [CPU seconds of one round, ...]}``."""
    import torch

    from fedcxr.models.network import network_from_config
    from fedcxr.vocab import CLASSES

    torch.set_num_threads(1)
    torch.manual_seed(0)
    sizes = {int(n): v for n, v in json.loads(sizes_path.read_text()).items()}
    net = network_from_config([CLASSES[0]], {"backbone": "resnet_tiny", "hidden": 64}).train()
    loss = torch.nn.BCEWithLogitsLoss()

    def one_round(site_rows: list[int]) -> float:
        start = time.process_time()
        for rows in site_rows:
            optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
            for first in range(0, rows, 64):
                batch = min(64, rows - first)
                x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 2, (batch, 1)).float()
                optimizer.zero_grad(set_to_none=True)
                loss(net(x)["main"][:, :1], y).backward()
                optimizer.step()
        return time.process_time() - start

    one_round(sizes[min(sizes)])  # warm-up: allocator and kernels, as a steady round
    out: dict[int, list[float]] = {n: [] for n in sizes}
    for repeat in range(repeats):
        for n in (sorted(sizes) if repeat % 2 == 0 else sorted(sizes, reverse=True)):
            out[n].append(one_round(sizes[n]))
    print(json.dumps(out))
    return 0


def training_floor(work: Path, manifests: dict[int, Path], repeats: int) -> dict[int, float]:
    """Median CPU seconds of the floor's round per N, measured in one fresh process."""
    sizes = {n: train_sizes(m, n) for n, m in manifests.items()}
    path = work / "floor_sizes.json"
    path.write_text(json.dumps(sizes))
    found = child_json(["--floor-child", str(path), str(repeats)], "the training floor")
    return {int(n): statistics.median(v) for n, v in found.items()}


def floor_lines(floor: dict[int, float], rows: Optional[dict[int, dict]] = None) -> list[str]:
    """The floor's table (with fedcxr's steady CPU beside it when ``rows``)."""
    base = floor[min(floor)]
    out = [f"{'sites':>5} | {'floor CPU s':>11} | {'ratio':>5}" + (f" | {'fedcxr steady CPU s':>19} | "
                                                                  f"{'above the floor s':>17}" if rows else "")]
    for n, value in sorted(floor.items()):
        line = f"{n:>5} | {value:>11.2f} | {value / base:>5.2f}"
        if rows and n in rows:
            line += f" | {rows[n]['steady_cpu']:>19.2f} | {rows[n]['steady_cpu'] - value:>17.2f}"
        out.append(line)
    return out


def print_floor(floor: dict[int, float], rows: Optional[dict[int, dict]] = None) -> None:
    """The floor's title and :func:`floor_lines`."""
    print("\nthe training floor (plain PyTorch, the same batches, a fresh Adam per site, one thread)"
          + (", beside fedcxr's steady round:" if rows else ":"))
    print("\n".join(floor_lines(floor, rows)))


def run(work: Path, n: int, manifests: Path, args, cache: Path, tag: str) -> dict:
    import yaml

    path = work / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(config(manifests, n, args.rounds, cache, args.method)))
    out = work / "runs" / tag
    if out.exists():
        import shutil

        shutil.rmtree(out)
    load = os.getloadavg()[0]
    result = child_json(["--child", str(path), str(out)], f"the {n}-site run")
    result["load"] = (load, os.getloadavg()[0])
    return result


def _median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def table(results: dict[int, list[dict]]) -> dict[int, dict]:
    """Per N: the medians over the repeats, and each one's ratio to the first (smallest) N."""
    def row(res: list[dict]) -> dict:
        return {"startup": _median(r["startup"] for r in res),
                "startup_cold": res[0]["startup"],
                "first": _median(r["rounds"][0] for r in res),
                "steady": _median(s for r in res for s in r["rounds"][1:]),
                "first_cpu": _median(r["cpu"][0] for r in res),
                "steady_cpu": _median(s for r in res for s in r["cpu"][1:]),
                "peak": _median(r["peak_mb"] for r in res),
                "chars": max(r["line_chars"] for r in res)}
    rows = {n: row(res) for n, res in results.items()}
    base = rows[min(rows)]
    for v in rows.values():
        v["ratios"] = {key: v[key] / base[key] for key in ("first", "steady", "steady_cpu", "first_cpu", "peak")}
    return rows


def summary(rows: dict[int, dict]) -> list[str]:
    """The table's lines."""
    out = [f"{'sites':>5} | {'start-up s':>10} | {'cold start s':>12} | {'round 1 s':>9} | {'steady s':>8} | "
           f"{'ratio':>5} | {'steady CPU s':>12} | {'ratio':>5} | {'round 1 CPU s':>13} | {'peak RSS MB':>11} | "
           f"{'ratio':>5} | {'line chars':>10}"]
    for n, v in rows.items():
        out.append(f"{n:>5} | {v['startup']:>10.1f} | {v['startup_cold']:>12.1f} | {v['first']:>9.2f} | "
                   f"{v['steady']:>8.2f} | {v['ratios']['steady']:>5.2f} | {v['steady_cpu']:>12.2f} | "
                   f"{v['ratios']['steady_cpu']:>5.2f} | {v['first_cpu']:>13.2f} | {v['peak']:>11.0f} | "
                   f"{v['ratios']['peak']:>5.2f} | {v['chars']:>10}")
    return out


def main(argv: list[str] | None = None) -> dict | int:
    """Run the comparison; returns the table (:func:`table`), or a child's exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--floor-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--floor-only", action="store_true",
                        help="only the training floor (plain PyTorch over the same batches), no fedcxr run")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="the PneumoniaMNIST .npz")
    parser.add_argument("--sites", type=int, nargs="+", default=[5, 50, 100])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--method", default="FedAvg")
    parser.add_argument("--work", type=Path, help="keep the ingests here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    if args.floor_child:
        return floor_child(Path(args.floor_child[0]), int(args.floor_child[1]))
    if not args.input.is_file():
        print(f"bench_scale: {args.input} not found (--input)", file=sys.stderr)
        return 2
    print(f"{len(os.sched_getaffinity(0))} usable cores; load average at start {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        manifests = {n: ingest(args.input, work, n) for n in args.sites}
        if args.floor_only:
            floor = training_floor(work, manifests, max(3, 2 * args.repeats))
            print_floor(floor)
            return {n: {"floor_cpu": v} for n, v in floor.items()}
        results: dict[int, list[dict]] = {n: [] for n in args.sites}
        for repeat in range(args.repeats):
            order = args.sites if repeat % 2 == 0 else args.sites[::-1]
            for n in order:
                cache = work / (f"cache-cold-{n}" if repeat == 0 else "cache")
                if repeat == 0 and cache.exists():
                    import shutil

                    shutil.rmtree(cache)
                res = run(work, n, manifests[n], args, cache, f"n{n}-r{repeat}")
                results[n].append(res)
                print(f"  repeat {repeat + 1}, {n} sites: start-up {res['startup']:.1f} s, rounds "
                      f"{', '.join(f'{s:.2f}' for s in res['rounds'])} s (CPU "
                      f"{', '.join(f'{s:.2f}' for s in res['cpu'])}), peak {res['peak_mb']:.0f} MB, "
                      f"round line {res['line_chars']} chars (load {res['load'][0]:.1f} -> {res['load'][1]:.1f})",
                      flush=True)
            if repeat == 0:  # later repeats read the warm cache every cold run left
                import shutil

                warm = work / "cache"
                warm.mkdir(exist_ok=True)
                for n in args.sites:
                    for path in (work / f"cache-cold-{n}").iterdir():
                        shutil.copyfile(path, warm / path.name)
        print(f"\nFedAvg, resnet_tiny at 28 px, {args.rounds} rounds, the same images dealt iid to N sites; medians of "
              f"{args.repeats} runs (cold start: the first repeat, empty image cache):")
        rows = table(results)
        print("\n".join(summary(rows)))
        floor = training_floor(work, manifests, max(3, 2 * args.repeats))
        for n, value in floor.items():
            rows[n]["floor_cpu"] = value
        print_floor(floor, rows)
        print(f"load average at end {os.getloadavg()}")
    return rows


if __name__ == "__main__":
    outcome = main()
    sys.exit(outcome if isinstance(outcome, int) else 0)
