"""``fedcxr stats``: every site's released counts → global, shift diagnosis, advice, report.

Two ways to gather the site payloads, one way to use them:

* in-process (:func:`collect_in_process`): each site of the config is counted and released by
  :func:`site_payload` — the very function a FLARE site runs (:mod:`fedcxr.flare.stats`);
* NVIDIA FLARE (:mod:`fedcxr.flare.stats_run`, passed in by the command as ``collect``): the
  sites answer FLARE's own federated statistics workflow and the server's sums come back.

:func:`assemble` then builds ``stats.json`` — ``sites`` (what each site sent), ``global`` (the
sums), ``min_count``, ``shift`` (distances, shift type, pilot) and ``advice`` — and
:func:`write_outputs` writes it with ``stats.md`` and the figures.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from fedcxr.atomic import atomic_write_bytes, atomic_write_json
from fedcxr.pipeline.config import ExperimentConfig
from fedcxr.stats import distances, merge
from fedcxr.stats.release import DEFAULT_MIN_COUNT, check_payload, check_privacy_options, failed_payload, release
from fedcxr.stats.site import SiteFailure, site_counts

log = logging.getLogger(__name__)

STATS_VERSION = 1


@dataclass
class StatsOptions:
    """How the sites count and release (the same at every site of one run)."""

    min_count: int = DEFAULT_MIN_COUNT
    epsilon: Optional[float] = None
    build_cache: bool = True
    headers: bool = True
    pilot: bool = True
    device: Optional[str] = None
    progress: bool = False

    def __post_init__(self) -> None:
        check_privacy_options(self.min_count, self.epsilon)


def cache_dir_of(cfg: ExperimentConfig) -> Path:
    from fedcxr.pipeline.data import default_cache_dir

    return Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()


def workers_of(cfg: ExperimentConfig) -> int:
    return int(cfg.engine.cache_workers or os.cpu_count() or 1)


def site_payload(site_dir: Path, name: str, *, image_size: int, cache_dir: Path, options: StatsOptions,
                 workers: int = 1) -> dict[str, Any]:
    """What one site sends: its counts released under the options, checked at the boundary."""
    try:
        counts = site_counts(site_dir, name=name, image_size=image_size, cache_dir=cache_dir,
                             build_cache=options.build_cache, headers=options.headers, workers=workers,
                             progress=options.progress)
    except SiteFailure as exc:
        return failed_payload(name, exc.public, min_count=options.min_count, epsilon=options.epsilon)
    payload = release(counts, min_count=options.min_count, epsilon=options.epsilon)
    check_payload(payload, options.min_count, where=f"site {name}")
    return payload


def collect_in_process(cfg: ExperimentConfig, options: StatsOptions) -> dict[str, dict]:
    """Every site of the config counted here, one after the other (sources, then the target)."""
    out = {}
    for site in cfg.all_sites():
        name = cfg.site_name(site)
        log.info("counting site %s", name)
        out[name] = site_payload(cfg.site_dir(site), name, image_size=cfg.image_size, cache_dir=cache_dir_of(cfg),
                                 options=options, workers=workers_of(cfg))
    return out


def site_section(payload: dict) -> dict[str, Any]:
    """``stats.json`` ``sites.<name>``: the payload as sent, with category names and derived values."""
    groups = payload.get("groups") or {}
    return {"status": payload.get("status"), "message": payload.get("message"),
            "unavailable": payload.get("unavailable") or {}, "privacy": payload.get("privacy"),
            "image_size": payload.get("image_size"), "groups": merge.with_categories(groups),
            "derived": merge.derived(groups)}


def shift_section(cfg: ExperimentConfig, payloads: dict[str, dict], pilot: Optional[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {"distances": distances.pairwise(payloads), "target_vs_sources": None,
                           "type": None, "pilot": pilot}
    if cfg.target:
        target = cfg.site_name(cfg.target)
        sources = [cfg.site_name(s) for s in cfg.source_sites()]
        out["target_vs_sources"] = {"target": target, "sources": sources,
                                    **distances.target_vs_sources(payloads, target, sources)}
        out["type"] = distances.shift_type(out["target_vs_sources"])
    return out


def assemble(cfg: ExperimentConfig, payloads: dict[str, dict], options: StatsOptions, *, transport: str,
             pilot: Optional[dict] = None, map_path: Optional[Path] = None,
             global_groups: Optional[dict] = None) -> dict[str, Any]:
    """``stats.json``. ``global_groups``: sums computed elsewhere (FLARE's server), used as given."""
    from fedcxr.stats.recommend import advise

    glob = merge.global_section(payloads, global_groups)
    shift = shift_section(cfg, payloads, pilot)
    return {
        "version": STATS_VERSION, "config": cfg.name, "transport": transport,
        "target": cfg.site_name(cfg.target) if cfg.target else None,
        "sources": [cfg.site_name(s) for s in cfg.source_sites()],
        "min_count": options.min_count,
        "privacy": {"min_count": options.min_count, "epsilon": options.epsilon,
                    "mechanism": _mechanism(options)},
        "sites": {name: site_section(p) for name, p in payloads.items()},
        "global": glob, "shift": shift, "advice": advise(cfg, payloads, shift, map_path),
    }


def _mechanism(options: StatsOptions) -> str:
    text = (f"every cell below {options.min_count} suppressed at the site (null), then more cells (the smallest "
            "shown, ties together) until no suppressed count from 1 to the min count minus 1 can be worked out from "
            "the cells shown, the group totals and the site's linked groups (secondary suppression, audited by "
            "linear programming across the age/sex pyramid and its margins, the acquisition groups and the splits)")
    if options.epsilon is None:
        return text + "; no noise"
    return (f"Laplace noise first: each site's ε = {options.epsilon:g} split evenly over its G groups, cell noise "
            "Lap(sensitivity·G/ε) with sensitivity 1 per row group and image_size² for the pixel histogram, "
            "rounded and clipped at 0; suppression on the noisy counts; " + text)


def run_stats(cfg: ExperimentConfig, out: Path, options: StatsOptions, *,
              collect: Optional[Callable[[ExperimentConfig, StatsOptions], tuple[dict, Optional[dict]]]] = None,
              transport: str = "in-process", map_path: Optional[Path] = None) -> dict[str, Any]:
    """Gather the payloads, run the pilot, write every output; returns stats.json.

    ``collect(cfg, options) -> (payloads, global sums or None)`` gathers the sites' payloads
    another way (``fedcxr stats --flare``: :func:`fedcxr.flare.stats_run.run_flare_stats`);
    by default every site is counted here (:func:`collect_in_process`).
    """
    from fedcxr.stats.pilot import pilot_estimates

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if collect is None:
        payloads, global_groups = collect_in_process(cfg, options), None
    else:
        payloads, global_groups = collect(cfg, options)
    usable = [name for name, p in payloads.items() if p.get("status") in ("ok", "partial")]
    pilot = (pilot_estimates(cfg, device=options.device, progress=options.progress, usable=usable)
             if options.pilot else None)
    stats = assemble(cfg, payloads, options, transport=transport, pilot=pilot, map_path=map_path,
                     global_groups=global_groups)
    write_outputs(out, stats)
    return stats


def write_outputs(out: Path, stats: dict[str, Any]) -> list[Path]:
    """``stats.json``, ``stats.md`` and the figures, all or nothing.

    Everything is written into a staging folder inside ``out`` first (same file system), then
    renamed into place, ``stats.json`` last; a figure of an earlier run that this one does not
    draw is removed. A full disk or any failure while writing therefore leaves the previous
    outputs as they were — never a new ``prevalence.png`` beside an old ``stats.json`` — and the
    renames need no space."""
    from fedcxr.stats.figures import FIGURES, write_figures
    from fedcxr.stats.report import render_markdown

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".stats-", dir=out))
    try:
        figures = write_figures(staging, stats)
        atomic_write_bytes(staging / "stats.md", render_markdown(stats, figures).encode())
        atomic_write_json(staging / "stats.json", stats)
        names = [p.name for p in figures.values()] + ["stats.md", "stats.json"]
        for name in names:
            os.replace(staging / name, out / name)
        for name in set(FIGURES) - set(figures):
            (out / f"{name}.png").unlink(missing_ok=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out / "stats.json", out / "stats.md", *(out / p.name for p in figures.values())]
