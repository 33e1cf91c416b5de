"""``fedcxr shift SITE_DIR --out OUT --kind K (--level L | --marker-rates P N)``: a shifted copy of a site.

The work is :func:`fedcxr.site_adapters.shift.shift_site` (its module doc holds the strength
table and the shortcut marker); this prints the new site, its parameters and where it was written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.errors import UserError
from fedcxr.wording import count

HELP = "a seeded covariate shift (noise/gamma/blur) or shortcut marker of one site's images → a new site"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("site_dir", type=Path, metavar="SITE_DIR", help="an ingested site folder (manifest.parquet + site.json)")
    p.add_argument("--out", required=True, type=Path, help="folder for the new site (OUT/<site>) and its PNGs")
    p.add_argument("--kind", required=True, choices=["noise", "gamma", "blur", "mix", "shortcut"],
                   help="noise: Gaussian noise; gamma: contrast curve; blur: Gaussian blur; mix: all three; "
                        "shortcut: a bright corner marker tied to a label (--marker-rates)")
    p.add_argument("--level", type=int, choices=[0, 1, 2, 3, 4], default=None,
                   help="noise/gamma/blur/mix: strength, 0 = none (identity) ... 4 = strong (table: BENCHMARKS.md, "
                        "`fedcxr.site_adapters.shift`)")
    p.add_argument("--marker-rates", type=float, nargs=2, default=None, metavar=("POSITIVE", "NEGATIVE"),
                   help="shortcut: fraction of the class's positive and of its negative rows that get the marker "
                        "(sources 0.95 0.05, target 0.05 0.95: the FedGP papers' ColoredMNIST -90%% case)")
    p.add_argument("--marker-class", default=None,
                   help="shortcut: the class the marker goes with; unset: the site's only class")
    p.add_argument("--seed", type=int, default=0, help="noise seed (same seed, same PNGs)")
    p.add_argument("--site-name", default=None, metavar="NAME", help="name of the new site; unset: the input site's name")


def run(args: argparse.Namespace) -> int:
    """``fedcxr shift``: see the module doc."""
    from fedcxr.logs import progress_wanted
    from fedcxr.site_adapters.shift import LEVELS, SHORTCUT, Shortcut, shift_site

    shortcut = None
    if args.kind == SHORTCUT or args.marker_rates is not None:
        if args.marker_rates is None:
            raise UserError("--kind shortcut needs --marker-rates P N (e.g. 0.95 0.05 at the sources, 0.05 0.95 at "
                            "the target)")
        shortcut = Shortcut(args.marker_class or _only_class(args.site_dir), *args.marker_rates)
    payload = shift_site(args.site_dir, args.out, kind=args.kind, level=args.level, seed=args.seed,
                         site_name=args.site_name, progress=progress_wanted(args), shortcut=shortcut)
    where = Path(args.out) / payload["site"]
    images = count(payload["rows"], "image")
    if shortcut is not None:
        print(f"site {payload['site']}: {images}, corner marker on {shortcut.positive_rate:.0%} of "
              f"{shortcut.class_name}-positive and {shortcut.negative_rate:.0%} of negative rows, seed {args.seed} "
              f"→ {where}")
        return 0
    p = LEVELS[args.level]
    print(f"site {payload['site']}: {images}, {args.kind} level {args.level} "
          f"(noise std {p.noise_std}, gamma {p.gamma}, blur sigma {p.blur_sigma} of the short side), "
          f"seed {args.seed} → {where}")
    return 0


def _only_class(site_dir: Path) -> str:
    """The site's class when it labels exactly one (the marker's default class)."""
    from fedcxr.site_adapters.manifest import read_site_json

    try:
        classes = list(read_site_json(Path(site_dir)).get("class_set") or [])
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    if len(classes) != 1:
        raise UserError(f"{site_dir}: the site labels {classes}; name the marker's class with --marker-class")
    return classes[0]
