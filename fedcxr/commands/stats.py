"""``fedcxr stats CONFIG.yaml --out DIR [--min-count K] [--epsilon E] [--flare simulate|poc]``.

Before training: each site of the config counts its rows, labels, demographics, acquisition
and pixel intensities where its data is, suppresses every count below K (optionally adds
Laplace noise first) and sends only that; the federation's sums, the sites' distances, a
one-round pilot of the FedGP theory's quantities and the regime map's advice for the target
land in ``DIR/stats.json``, ``DIR/stats.md`` and four PNG figures (:mod:`fedcxr.stats`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.logs import progress_wanted
from fedcxr.pipeline.config import load_config
from fedcxr.stats.run import StatsOptions, run_stats


def cli_stats(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, overrides=args.overrides)
    options = StatsOptions(min_count=args.min_count, epsilon=args.epsilon, build_cache=args.cache_build,
                           headers=args.headers, pilot=args.pilot, device=args.device,
                           progress=progress_wanted(args))
    collect = None
    if args.flare:
        from fedcxr.flare.controller import require_nvflare

        require_nvflare()
        from fedcxr.flare.stats_run import run_flare_stats

        def collect(cfg, options):
            return run_flare_stats(cfg, Path(args.out) / "flare", options, mode=args.flare)

    stats = run_stats(cfg, Path(args.out), options, collect=collect,
                      transport=f"NVIDIA FLARE {args.flare}" if args.flare else "in-process",
                      map_path=args.regime_map)
    print_summary(stats, Path(args.out))
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
