"""``fedcxr stats CONFIG.yaml --out DIR`` as a library function: before training, how different are
the hospitals, and which method does the regime map advise?

Each site of the config counts its rows, labels, demographics, acquisition and pixel
intensities where its data is, suppresses every count below ``min_count`` (optionally adds
Laplace noise first) and sends only that — in this process, or through NVIDIA FLARE's federated
statistics workflow (``flare="simulate"|"poc"``). The federation's sums, the sites' distances, a
one-round pilot of the FedGP theory's quantities and the advice land in ``DIR/stats.json``,
``DIR/stats.md`` and four PNG figures (:mod:`fedcxr.stats`). The API name is
``fedcxr.statistics``: ``fedcxr.stats`` is the package this calls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from fedcxr.workflows.experiment import ConfigLike, experiment_config


@dataclass(frozen=True)
class StatsResult:
    """``stats`` is ``stats.json``'s content (``sites``, ``global``, ``shift``, ``advice``, ...);
    ``files``: stats.json, stats.md and the figures."""

    out: Path
    stats: dict[str, Any] = field(repr=False)
    files: list[Path] = field(default_factory=list, repr=False)

    @property
    def advice(self) -> dict[str, Any]:
        return self.stats["advice"]


def statistics(config: ConfigLike, out: "str | os.PathLike", *, min_count: int = 5, epsilon: Optional[float] = None,
               flare: Optional[str] = None, pilot: bool = True, cache_build: bool = True, headers: bool = True,
               regime_map: "str | os.PathLike | None" = None, device: Optional[str] = None, progress: bool = True,
               settings: Sequence[str] = (), **overrides: Any) -> StatsResult:
    """Federated statistics, shift diagnosis and method advice for ``config``'s sites, into ``out``.

    ``min_count``: a count below it is suppressed at its site; ``epsilon``: Laplace noise budget per
    site (unset: none); ``flare``: gather through NVIDIA FLARE (``simulate`` or ``poc``; unset:
    in-process); ``pilot``: the one-round pilot estimate (it trains one round); ``cache_build``,
    ``headers``: decode images for pixel statistics, read every image's header;
    ``regime_map``: a CSV to advise from (unset: the shipped map). ``config``/``settings``/
    ``overrides`` as for :func:`fedcxr.train`."""
    from fedcxr.stats.run import StatsOptions, run_stats

    cfg = experiment_config(config, settings=settings, overrides=overrides)
    out = Path(out)
    options = StatsOptions(min_count=min_count, epsilon=epsilon, build_cache=cache_build, headers=headers,
                           pilot=pilot, device=device, progress=progress)
    collect = None
    if flare:
        from fedcxr.errors import UserError
        from fedcxr.flare.controller import require_nvflare

        if flare not in ("simulate", "poc"):
            raise UserError(f"--flare {flare!r}: choose simulate or poc")
        require_nvflare()
        from fedcxr.flare.stats_run import run_flare_stats

        def collect(cfg, options):
            return run_flare_stats(cfg, out / "flare", options, mode=flare)

    stats = run_stats(cfg, out, options, collect=collect, transport=f"NVIDIA FLARE {flare}" if flare else "in-process",
                      map_path=Path(regime_map) if regime_map else None)
    files = [out / "stats.json", out / "stats.md"] + sorted(out.glob("*.png"))
    return StatsResult(out, stats, files)


__all__ = ["StatsResult", "statistics"]
