"""The server's side of ``fedcxr stats --flare``: FLARE's statistics job, and reading its result back.

The job is NVIDIA FLARE's own ``StatsJob`` (``nvflare.job_config.stats_job``) with three
fedcxr pieces:

* at each site :class:`fedcxr.flare.stats.FedcxrStatistics` behind FLARE's
  ``StatisticsExecutor``, FLARE's ``StatisticsPrivacyFilter`` with its ``MinCountCleanser``
  (min count K, defence in depth: the site already suppressed every cell below K) and, last,
  :class:`fedcxr.flare.stats.SentStatisticsRecorder`. FLARE's ``AddNoiseToMinMax`` and
  ``HistogramBinsCleanser`` are not used: every histogram range is fixed by fedcxr (no min or
  max leaves a site), and the bins of a categorical group are its categories, each cell
  already held to K;
* on the server :class:`FedcxrStatisticsController`, FLARE's ``StatisticsController`` with
  two changes: it asks for the pre-run handshake (the sites' status travels there), and a
  site that fails is recorded by name while the others' statistics are still combined and
  written (FLARE's default aborts the whole job when a site's result is missing);
* FLARE's ``JsonStatsFileWriter`` writes the result, :data:`OUTPUT` in the server's job folder.

:func:`read_result` turns that file back into fedcxr payloads (one per site, as it sent them)
and the server's global sums, checking everything a site could have put there.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from nvflare.apis.fl_constant import ReturnCode
from nvflare.app_common.app_constant import StatisticsConstants as StC
from nvflare.app_common.workflows.statistics_controller import StatisticsController
from nvflare.job_config.stats_job import StatsJob

from fedcxr.flare import TASK_REQUEST_INTERVAL
from fedcxr.stats import groups as G
from fedcxr.vocab import CLASSES

OUTPUT = "statistics/fedcxr_stats.json"
SITE_REPORTS = "__fedcxr_sites__"
CONTROLLER_PATH = "fedcxr.flare.stats_job.FedcxrStatisticsController"
STATISTICS_PATH = "fedcxr.flare.stats.FedcxrStatistics"
RECORDER_PATH = "fedcxr.flare.stats.SentStatisticsRecorder"
STATUSES = ("ok", "partial", "suppressed", "failed")
MAX_TEXT = 300


def statistic_configs() -> dict:
    """FLARE's ``statistic_configs``: count, and a histogram of every fedcxr group over its categories."""
    names = G.all_groups(list(CLASSES))
    return {StC.STATS_COUNT: {}, StC.STATS_HISTOGRAM: {
        name: {StC.STATS_BINS: len(G.categories(name)), StC.STATS_BIN_RANGE: [0, len(G.categories(name))]}
        for name in names}}


class FedcxrStatisticsController(StatisticsController):
    """FLARE's ``StatisticsController``; a failing site is named, the others are still combined.

    ``min_sites_ok``: how many sites must send statistics for the result to be written.
    """

    def __init__(self, statistic_configs: dict, writer_id: str, min_clients: Optional[int] = None,
                 min_sites_ok: int = 1, result_wait_timeout: int = 10, wait_time_after_min_received: int = 1):
        super().__init__(statistic_configs=statistic_configs, writer_id=writer_id, min_clients=min_clients,
                         result_wait_timeout=result_wait_timeout,
                         wait_time_after_min_received=wait_time_after_min_received, enable_pre_run_task=True)
        self.min_sites_ok = int(min_sites_ok)
        self.abort_job_in_error = {code: False for code in self.abort_job_in_error}
        self.site_reports: dict[str, dict] = {}

    def results_pre_run_cb(self, client_task, fl_ctx) -> None:
        from nvflare.apis.dxo import from_shareable

        name = client_task.client.name
        result = client_task.result
        if result.get_return_code() == ReturnCode.OK:
            try:
                self.site_reports[name] = dict(from_shareable(result).data)
            except Exception:  # a malformed answer is recorded as such, never trusted
                self.site_reports[name] = {"status": "failed", "message": "malformed pre-run answer"}
        else:
            self.site_reports[name] = {"status": "failed",
                                       "message": f"the site's pre-run task failed ({result.get_return_code()})"}
        super().results_pre_run_cb(client_task, fl_ctx)

    def results_cb(self, client_task, fl_ctx) -> None:
        name = client_task.client.name
        code = client_task.result.get_return_code()
        if code != ReturnCode.OK:
            entry = self.site_reports.setdefault(name, {})
            entry["task_failed"] = f"{client_task.task.props.get(StC.STATISTICS_TASK_KEY)}: {code}"
        super().results_cb(client_task, fl_ctx)

    def _validate_min_clients(self, min_clients: int, client_statistics: dict) -> bool:
        return super()._validate_min_clients(self.min_sites_ok, client_statistics)

    def _combine_all_statistics(self):
        result = super()._combine_all_statistics()
        result[SITE_REPORTS] = self.site_reports
        return result


class FedcxrStatsJob(StatsJob):
    """FLARE's ``StatsJob`` with fedcxr's controller, site filters and recorder (module docstring)."""

    def __init__(self, name: str, stats_generator, *, min_count: int, sites: list[str]):
        self.sites = list(sites)
        super().__init__(name=name, statistic_configs=statistic_configs(), stats_generator=stats_generator,
                         output_path=OUTPUT, min_count=min_count)
        self.set_app_packages(["fedcxr"])  # every site imports its installed fedcxr; no fedcxr code is copied
        self.to({"server": {"task_request_interval": TASK_REQUEST_INTERVAL}}, "server")  # FLARE's default: 2 s

    def get_stats_controller(self) -> StatisticsController:
        return FedcxrStatisticsController(statistic_configs=self.statistic_configs, writer_id=self.writer_id,
                                          min_clients=len(self.sites))

    def add_privacy_result_filters(self, site_id: str) -> None:
        from nvflare.app_common.filters.statistics_privacy_filter import StatisticsPrivacyFilter
        from nvflare.app_common.statistics.min_count_cleanser import MinCountCleanser
        from nvflare.job_config.defs import FilterType

        from fedcxr.flare.stats import SentStatisticsRecorder

        cleanser = self.to(MinCountCleanser(min_count=self.min_count), site_id, id="min_count_cleanser")
        self.to(StatisticsPrivacyFilter(result_cleanser_ids=[cleanser]), site_id,
                filter_type=FilterType.TASK_RESULT, tasks=[StC.FED_STATS_TASK])
        # after the privacy filter on the same task set (FLARE's task sets of filters may not overlap)
        self.to(SentStatisticsRecorder(), site_id, filter_type=FilterType.TASK_RESULT, tasks=[StC.FED_STATS_TASK])
        self.to(SentStatisticsRecorder(), site_id, filter_type=FilterType.TASK_RESULT, tasks=[StC.FED_STATS_PRE_RUN])


# --------------------------------------------------------------------------- the result, read back


def read_result(data: dict, sites: list[str], min_count: int) -> tuple[dict[str, dict], dict[str, dict]]:
    """FLARE's result → ``(payloads per site, global groups)``, every value checked.

    A site's cell of 0 is a suppressed cell (null), as is a global 0 (suppressed everywhere):
    every released cell is ≥ K ≥ 1. A feature, value or report that does not fit fedcxr's
    groups is dropped and the site's message says so; a site that sent nothing is ``failed``.
    """
    reports = data.get(SITE_REPORTS) if isinstance(data.get(SITE_REPORTS), dict) else {}
    payloads = {site: _payload_of(site, reports.get(site)) for site in sites}
    glob: dict[str, dict] = {}
    dropped: dict[str, list[str]] = {site: [] for site in sites}
    for feature, by_statistic in data.items():
        if feature == SITE_REPORTS:
            continue
        if not G.is_group(feature) or not isinstance(by_statistic, dict):
            continue
        histograms = by_statistic.get(StC.STATS_HISTOGRAM) or {}
        counts = by_statistic.get(StC.STATS_COUNT) or {}
        for client, by_dataset in histograms.items():
            cells = _cells(feature, _dataset_value(by_dataset))
            total = _number(_dataset_value(counts.get(client)))
            if client == StC.GLOBAL:
                if cells is not None:
                    glob[feature] = {"count": _released(total), "counts": [_released(v) for v in cells]}
                continue
            if client not in payloads:
                continue
            if cells is None or total is None or any(0 < v < min_count for v in cells) or 0 < total < min_count:
                dropped[client].append(feature)
                continue
            payloads[client]["groups"][feature] = {"count": _released(total), "counts": [_released(v) for v in cells]}
    for site, names in dropped.items():
        if names:
            payloads[site]["message"] = (payloads[site].get("message") or "") + \
                f"; {len(names)} feature(s) dropped by the server as malformed"
    for payload in payloads.values():
        payload["groups"] = {n: payload["groups"][n] for n in G.all_groups(list(CLASSES)) if n in payload["groups"]}
        if payload["status"] in ("ok", "partial") and not payload["groups"]:
            payload["status"] = "failed"
            payload["message"] = "no usable statistics received from the site; " + (payload["message"] or "")
    return payloads, {n: glob[n] for n in G.all_groups(list(CLASSES)) if n in glob}


def _payload_of(site: str, report: Any) -> dict:
    report = report if isinstance(report, dict) else {}
    status = report.get("status") if report.get("status") in STATUSES else "failed"
    message = _text(report.get("message")) if report else "no answer from the site (see its FLARE log)"
    if report.get("task_failed"):
        message = f"{message}; a statistics task failed ({_text(report['task_failed'])})"
    unavailable = report.get("unavailable") if isinstance(report.get("unavailable"), dict) else {}
    privacy = report.get("privacy") if isinstance(report.get("privacy"), dict) else {}
    size = report.get("image_size")
    return {"version": report.get("version"), "site": site, "status": status, "message": message,
            "unavailable": {_text(k): _text(v) for k, v in unavailable.items() if k in G.SECTIONS},
            "privacy": {"min_count": _number(privacy.get("min_count")), "epsilon": _real(privacy.get("epsilon")),
                        "epsilon_per_group": _real(privacy.get("epsilon_per_group")),
                        "mechanism": _text(privacy.get("mechanism", ""))},
            "image_size": int(size) if isinstance(size, int) and not isinstance(size, bool) else None,
            "groups": {}}


def _dataset_value(by_dataset: Any) -> Any:
    from fedcxr.flare.stats import DATASET

    return by_dataset.get(DATASET) if isinstance(by_dataset, dict) else None


def _cells(feature: str, bins: Any) -> Optional[list[int]]:
    """FLARE's ``[[low, high, count], ...]`` as counts, when they are fedcxr's bins of ``feature``."""
    expected = len(G.categories(feature))
    if not isinstance(bins, list) or len(bins) != expected:
        return None
    out = []
    for i, item in enumerate(bins):
        if not isinstance(item, (list, tuple)) or len(item) != 3 or (item[0], item[1]) != (float(i), float(i + 1)):
            return None
        value = _number(item[2])
        if value is None:
            return None
        out.append(value)
    return out


def _number(value: Any) -> Optional[int]:
    """A non-negative whole count, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if value < 0 or value != int(value):
        return None
    return int(value)


def _real(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _released(value: Optional[int]) -> Optional[int]:
    return None if not value else int(value)


def _text(value: Any) -> str:
    text = "".join(ch for ch in str(value) if ch.isprintable())
    return text[:MAX_TEXT]
