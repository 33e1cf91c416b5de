"""Calibrate the shift diagnosis of ``fedcxr stats`` on real PneumoniaMNIST.

``fedcxr stats`` calls a target's pixels shifted ("pixel" in the regime map) when the
Wasserstein-1 distance between its intensity histogram and the pooled sources' reaches
``fedcxr.stats.distances.PIXEL_SHIFT_W1``. This script measures that distance where the answer
is known: the shift benchmark's sites (``benchmarks/bench_shift.py``: three IID sources from the
official train rows, the target from the official test rows) with the target shifted by
``fedcxr shift --kind K --level L`` (levels 0–4; 0 = unshifted), plus the W1 between two IID
sources (the sampling floor). Every number comes from the released payloads (K = 5), exactly
as ``fedcxr stats`` computes it.

    nice -n 10 python benchmarks/bench_stats_shift.py --work runs/bench_stats_shift

Prints a Markdown table (BENCHMARKS.md "Shift diagnosis") and the load average.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench_shift import DEFAULT_NPZ, prepare_sites, shifted_target

from fedcxr.stats.distances import PIXEL_SHIFT_W1, target_vs_sources, wasserstein1
from fedcxr.stats.merge import estimated_cells
from fedcxr.stats.run import StatsOptions, site_payload

SIZE = 28
SOURCES = ["site-1", "site-2", "site-3"]


def payload(site_dir: Path, name: str, cache: Path) -> dict:
    return site_payload(site_dir, name, image_size=SIZE, cache_dir=cache,
                        options=StatsOptions(min_count=5, headers=False, pilot=False), workers=2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/bench_stats_shift"))
    parser.add_argument("--npz", type=Path, default=DEFAULT_NPZ)
    parser.add_argument("--kinds", nargs="+", default=["mix", "noise", "gamma", "blur"])
    parser.add_argument("--levels", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    manifests = prepare_sites(args.npz, args.work, n_sources=3, target_split=(0.45, 0.15, 0.40))
    cache = args.work / "cache"
    payloads = {s: payload(manifests / s, s, cache) for s in SOURCES}
    floor = [wasserstein1(estimated_cells(payloads[a]["groups"]["intensity"]),
                          estimated_cells(payloads[b]["groups"]["intensity"]))
             for i, a in enumerate(SOURCES) for b in SOURCES[i + 1:]]
    print(f"W1 between two IID sources (sampling floor): {', '.join(f'{v:.4f}' for v in floor)}")
    base = payload(manifests / "target-base", "target", cache)
    unshifted = target_vs_sources({**payloads, "target": base}, "target", SOURCES)
    print(f"unshifted target vs sources: W1 {unshifted['intensity']:.4f}, labels JS {unshifted['labels']:.4f}\n")
    print("| kind | " + " | ".join(f"level {lv}" for lv in args.levels) + " |")
    print("|---|" + "---|" * len(args.levels))
    for kind in args.kinds:
        cells = []
        for level in args.levels:
            target = payload(shifted_target(manifests, args.work, kind, level), "target", cache)
            d = target_vs_sources({**payloads, "target": target}, "target", SOURCES)
            mark = "pixel" if d["intensity"] is not None and d["intensity"] >= PIXEL_SHIFT_W1 else "none"
            cells.append(f"{d['intensity']:.4f} ({mark})")
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print(f"\nthreshold PIXEL_SHIFT_W1 = {PIXEL_SHIFT_W1}; {time.perf_counter() - t0:.0f} s; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
