"""``fedcxr shift SITE_DIR --out OUT --kind K (--level L | --marker-rates P N)``: a shifted copy of a site.

The work is :func:`fedcxr.site_adapters.shift.shift_site` (its module doc holds the strength
table and the shortcut marker); this prints the new site, its parameters and where it was written.
"""

from __future__ import annotations

from pathlib import Path

from fedcxr.errors import UserError
from fedcxr.logs import progress_wanted
from fedcxr.site_adapters.shift import LEVELS, SHORTCUT, Shortcut, shift_site


def cli_shift(args) -> int:
    """``fedcxr shift``: see the module doc."""
    shortcut = None
    if args.kind == SHORTCUT or args.marker_rates is not None:
        if args.marker_rates is None:
            raise UserError("--kind shortcut needs --marker-rates P N (e.g. 0.95 0.05 at the sources, 0.05 0.95 at "
                            "the target)")
        shortcut = Shortcut(args.marker_class or _only_class(args.site_dir), *args.marker_rates)
    payload = shift_site(args.site_dir, args.out, kind=args.kind, level=args.level, seed=args.seed,
                         site_name=args.site_name, progress=progress_wanted(args), shortcut=shortcut)
    where = Path(args.out) / payload["site"]
    if shortcut is not None:
        print(f"site {payload['site']}: {payload['rows']} images, corner marker on {shortcut.positive_rate:.0%} of "
              f"{shortcut.class_name}-positive and {shortcut.negative_rate:.0%} of negative rows, seed {args.seed} "
              f"→ {where}")
        return 0
    p = LEVELS[args.level]
    print(f"site {payload['site']}: {payload['rows']} images, {args.kind} level {args.level} "
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
