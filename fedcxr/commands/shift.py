"""``fedcxr shift SITE_DIR --out OUT --kind K --level L``: a covariate-shifted copy of a site.

The work is :func:`fedcxr.site_adapters.shift.shift_site` (its module doc holds the strength
table); this prints the new site, its level's parameters and where it was written.
"""

from __future__ import annotations

from pathlib import Path

from fedcxr.logs import progress_wanted
from fedcxr.site_adapters.shift import LEVELS, shift_site


def cli_shift(args) -> int:
    """``fedcxr shift``: see :mod:`fedcxr.site_adapters.shift`."""
    payload = shift_site(args.site_dir, args.out, kind=args.kind, level=args.level, seed=args.seed,
                         site_name=args.site_name, progress=progress_wanted(args))
    p = LEVELS[args.level]
    print(f"site {payload['site']}: {payload['rows']} images, {args.kind} level {args.level} "
          f"(noise std {p.noise_std}, gamma {p.gamma}, blur sigma {p.blur_sigma} of the short side), "
          f"seed {args.seed} → {Path(args.out) / payload['site']}")
    return 0
