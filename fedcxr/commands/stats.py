"""``fedcxr stats CONFIG.yaml --out DIR [--min-count K] [--epsilon E] [--flare simulate|poc]``.

The work is :func:`fedcxr.workflows.stats.statistics` (before training: each site counts where
its data is and releases only counts of at least K; the federation's sums, the shift diagnosis,
a one-round pilot and the regime map's advice land in ``DIR``); this prints each site's status,
the shift type and the advice.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.commands.options import add_device, add_set

HELP = "before training: federated statistics, shift diagnosis, method advice"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, metavar="CONFIG.yaml",
                   help="experiment YAML (its sites, target, rounds and label budget)")
    p.add_argument("--out", required=True, type=Path, help="folder for stats.json, stats.md and the figures")
    p.add_argument("--min-count", type=int, default=5, metavar="K",
                   help="a count below K is suppressed at its site (null, never sent)")
    p.add_argument("--epsilon", type=float, default=None, metavar="E",
                   help="Laplace noise on every count, budget E per site split over its groups; unset: no noise")
    p.add_argument("--flare", choices=["simulate", "poc"], default=None,
                   help="gather the statistics through NVIDIA FLARE's federated statistics workflow "
                        "(simulator or POC system on loopback); unset: in-process")
    p.add_argument("--no-pilot", dest="pilot", action="store_false",
                   help="skip the one-round pilot estimate of σ², d², τ²d² (it trains one round)")
    p.add_argument("--no-cache-build", dest="cache_build", action="store_false",
                   help="report pixel intensities only where the decode-once cache exists (never decode images)")
    p.add_argument("--no-headers", dest="headers", action="store_false",
                   help="skip the acquisition section (reads every image file's header)")
    p.add_argument("--regime-map", type=Path, default=None, metavar="CSV",
                   help="regime map to advise from; unset: the map shipped with fedcxr")
    add_device(p, what="the config's `device` (pilot round)")
    add_set(p)


def run(args: argparse.Namespace) -> int:
    from fedcxr.logs import progress_wanted
    from fedcxr.workflows.stats import statistics

    result = statistics(args.config, args.out, min_count=args.min_count, epsilon=args.epsilon, flare=args.flare,
                        pilot=args.pilot, cache_build=args.cache_build, headers=args.headers,
                        regime_map=args.regime_map, device=args.device, progress=progress_wanted(args),
                        settings=args.overrides)
    print_summary(result.stats, Path(args.out))
    return 0


def print_summary(stats: dict, out: Path) -> None:
    k = stats["min_count"]
    print(f"federation statistics ({stats['transport']}; counts below {k} suppressed at each site):")
    for name, entry in stats["sites"].items():
        split = entry["groups"].get("split") or {}
        rows = split.get("count")
        shown = f"{rows} rows" if rows is not None else f"fewer than {k} rows"
        print(f"  {name:<24} {entry['status']:<10} {shown if entry['status'] != 'failed' else ''} "
              f"{entry.get('message') or ''}".rstrip())
    shift = stats["shift"].get("type")
    if shift:
        print(f"  shift type of the target: {shift['value']} ({shift['why']})")
    advice = stats["advice"]
    if advice.get("recommendation"):
        print(f"  advice for {advice['target']}: {advice['recommendation']} — {advice['why']}")
    else:
        print(f"  advice: {advice['verdict']} — {advice.get('why', '')}")
    if advice.get("next"):
        print(f"  next: {advice['next']}")
    print(f"  written: {out / 'stats.json'}, {out / 'stats.md'} and the figures beside them")
