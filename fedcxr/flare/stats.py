"""A hospital's side of ``fedcxr stats --flare``: a FLARE ``Statistics`` over fedcxr's released groups.

NVIDIA FLARE's federated statistics workflow (``StatisticsController`` on the server,
``StatisticsExecutor`` at each site) asks a site's ``Statistics`` for *features* of
*datasets*, then for each feature's ``count`` and ``histogram`` over bins the server fixes.
:class:`FedcxrStatistics` answers with the site's payload from
:func:`fedcxr.stats.run.site_payload` — the same counting, noise and min-count suppression as
``fedcxr stats`` in-process, computed once per job:

* one dataset, :data:`DATASET` (all splits; the ``split`` group carries the split sizes);
* one integer feature per fedcxr group (``split``, ``label.<class>``, ``sex``, …,
  ``intensity``); its histogram has one bin ``[i, i + 1)`` per category of the group, in the
  fixed order of :func:`fedcxr.stats.groups.categories`;
* ``count`` = the group's released total (0 when suppressed, so FLARE's own
  ``MinCountCleanser`` drops the feature as well).

What FLARE's spec cannot express exactly, and what is done instead: a FLARE ``Bin`` has no
null, and the server's histogram sum needs every bin at every site, so a **suppressed cell
travels as 0**. Every released cell is ≥ K ≥ 1, so a 0 means "suppressed" and nothing else;
:mod:`fedcxr.flare.stats_job` reads it back as null and a global 0 as "suppressed at every
site" — exactly the in-process rule. A site's status and the public reason of a failure (a
category of problem, never a path) travel as the answer to FLARE's pre-run handshake.

:class:`SentStatisticsRecorder`, the last result filter of every site, appends what the site
sends — after FLARE's privacy filter — to ``fedcxr_sent_statistics.jsonl`` in the site's job
folder: the hospital's own record of what left it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.dxo_filter import DXOFilter
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.abstract.statistics_spec import Bin, DataType, Feature, Histogram, HistogramType, Statistics
from nvflare.app_common.app_constant import StatisticsConstants as StC
from nvflare.fuel.utils import fobs

log = logging.getLogger(__name__)

DATASET = "all"
SENT_RECORD = "fedcxr_sent_statistics.jsonl"
#: Keys of a site's pre-run answer (its status); nothing else is sent there.
REPORT_KEYS = ("version", "site", "status", "message", "unavailable", "privacy", "image_size")


class FedcxrStatistics(Statistics):
    """fedcxr's counts of one site as FLARE features (see the module docstring).

    Arguments are the run's settings, the same at every site: ``image_size`` (the cache the
    intensity histogram is taken from), ``min_count`` (K), ``epsilon`` (Laplace budget or
    ``None``), ``build_cache`` and ``headers`` (as ``fedcxr stats``). The site's data location
    comes from its own ``fedcxr_site.json`` (:func:`fedcxr.flare.client.find_site_config`).
    """

    def __init__(self, image_size: int, min_count: int = 5, epsilon: Optional[float] = None,
                 build_cache: bool = True, headers: bool = True):
        super().__init__()
        self.image_size = int(image_size)
        self.min_count = int(min_count)
        self.epsilon = None if epsilon is None else float(epsilon)
        self.build_cache = bool(build_cache)
        self.headers = bool(headers)
        self.site = ""
        self.custom_dir: Optional[Path] = None
        self.payload: Optional[dict] = None

    def initialize(self, fl_ctx: FLContext) -> None:
        """Remember who and where this site is; nothing is read yet (a failure here would stop the client)."""
        self.site = fl_ctx.get_identity_name()
        app_root = fl_ctx.get_prop(FLContextKey.APP_ROOT)
        self.custom_dir = Path(app_root) / "custom" if app_root else None

    # ------------------------------------------------------------------ the site's payload, once
    def _payload(self) -> dict:
        if self.payload is None:
            self.payload = compute_payload(self.site, self.custom_dir, image_size=self.image_size,
                                           min_count=self.min_count, epsilon=self.epsilon,
                                           build_cache=self.build_cache, headers=self.headers)
        return self.payload

    def pre_run(self, statistics: List[str], num_of_bins: Optional[Dict[str, Optional[int]]],
                bin_ranges: Optional[Dict[str, Optional[List[float]]]]) -> dict:
        """FLARE's handshake: count now; answer with this site's status (no counts)."""
        payload = self._payload()
        return {key: payload.get(key) for key in REPORT_KEYS}

    def features(self) -> Dict[str, List[Feature]]:
        groups = self._payload().get("groups") or {}
        return {DATASET: [Feature(name, DataType.INT) for name in groups]} if groups else {}

    def count(self, dataset_name: str, feature_name: str) -> int:
        value = self._group(dataset_name, feature_name).get("count")
        return 0 if value is None else int(value)

    def failure_count(self, dataset_name: str, feature_name: str) -> int:
        return 0

    def histogram(self, dataset_name: str, feature_name: str, num_of_bins: int, global_min_value: float,
                  global_max_value: float) -> Histogram:
        cells = self._group(dataset_name, feature_name)["counts"]
        if (num_of_bins, float(global_min_value), float(global_max_value)) != (len(cells), 0.0, float(len(cells))):
            raise ValueError(f"feature {feature_name}: the server asks for {num_of_bins} bins over "
                             f"[{global_min_value}, {global_max_value}); fedcxr sends {len(cells)} bins over "
                             f"[0, {len(cells)}) (fedcxr versions differ?)")
        return Histogram(HistogramType.STANDARD, [Bin(float(i), float(i + 1), 0 if v is None else int(v))
                                                  for i, v in enumerate(cells)])

    def _group(self, dataset_name: str, feature_name: str) -> dict:
        groups = self._payload().get("groups") or {}
        if dataset_name != DATASET or feature_name not in groups:
            raise KeyError(f"no feature {feature_name!r} in dataset {dataset_name!r} at site {self.site}")
        return groups[feature_name]


def compute_payload(site: str, custom_dir: Optional[Path], *, image_size: int, min_count: int,
                    epsilon: Optional[float], build_cache: bool, headers: bool) -> dict:
    """The site's payload, or a ``failed`` payload with a public reason (the detail goes to the log)."""
    from fedcxr.flare.client import find_site_config, load_site_config
    from fedcxr.pipeline.data import default_cache_dir
    from fedcxr.stats.release import failed_payload
    from fedcxr.stats.run import StatsOptions, site_payload

    options = StatsOptions(min_count=min_count, epsilon=epsilon, build_cache=build_cache, headers=headers,
                           pilot=False)
    try:
        path = find_site_config(None, custom_dir, Path.cwd())
        config = load_site_config(path, site)
    except Exception as exc:  # no or bad site configuration: say so by kind, keep the detail here
        log.error("site %s: no usable fedcxr site configuration: %s", site, exc)
        return failed_payload(site, "no usable fedcxr site configuration (fedcxr_site.json)",
                              min_count=min_count, epsilon=epsilon)
    try:
        return site_payload(config.manifest_dir, site, image_size=image_size,
                            cache_dir=config.cache_dir or default_cache_dir(), options=options,
                            workers=int(config.num_workers or os.cpu_count() or 1))
    except Exception as exc:  # a bug or a disk error mid-way: the others' statistics still count
        log.exception("site %s: statistics failed", site)
        return failed_payload(site, f"statistics failed at the site ({type(exc).__name__}; see the site's log)",
                              min_count=min_count, epsilon=epsilon)


class SentStatisticsRecorder(DXOFilter):
    """Appends every statistics result this site sends to ``fedcxr_sent_statistics.jsonl`` (its job folder)."""

    def __init__(self):
        super().__init__(supported_data_kinds=[DataKind.STATISTICS], data_kinds_to_filter=[DataKind.STATISTICS])

    def process_dxo(self, dxo: DXO, shareable: Shareable, fl_ctx: FLContext) -> Optional[DXO]:
        app_root = fl_ctx.get_prop(FLContextKey.APP_ROOT)
        folder = Path(app_root).parent if app_root else Path.cwd()
        record = {"site": fl_ctx.get_identity_name(), "sent": sent_record(dxo.data)}
        with open(folder / SENT_RECORD, "a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
        return dxo


def sent_record(data: dict) -> dict:
    """A statistics result (or a pre-run answer) as plain JSON: FLARE's histograms as ``[low, high, count]``."""
    task = data.get(StC.STATISTICS_TASK_KEY) if isinstance(data, dict) else None
    if task is None:
        return {"handshake": data}
    statistics = fobs.loads(data[task])
    return {"task": task, "statistics": _plain(statistics)}


def _plain(value: Any) -> Any:
    if isinstance(value, Histogram):
        return [[b.low_value, b.high_value, b.sample_count] for b in value.bins]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


__all__ = ["DATASET", "FedcxrStatistics", "SENT_RECORD", "SentStatisticsRecorder", "compute_payload"]
