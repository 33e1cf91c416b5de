"""The server reads FLARE's statistics result back as fedcxr payloads, trusting nothing a site sent."""

from __future__ import annotations

import pytest

pytest.importorskip("nvflare")

from fedcxr.flare.stats_job import SITE_REPORTS, read_result, statistic_configs  # noqa: E402
from fedcxr.stats import groups as G  # noqa: E402


def bins(*counts):
    return [[float(i), float(i + 1), c] for i, c in enumerate(counts)]


def result(**features):
    data = {SITE_REPORTS: {
        "a": {"status": "ok", "message": "fine", "privacy": {"min_count": 5, "epsilon": None, "mechanism": "none"},
              "image_size": 32, "unavailable": {}},
        "b": {"status": "hacked", "message": "x" * 5000 + "\x1b[31m", "unavailable": {"../../etc": "y"},
              "image_size": "32"},
    }}
    data.update(features)
    return data


def test_zeros_on_flares_wire_are_suppressed_cells_and_the_global_keeps_flares_sums():
    data = result(split={"count": {"a": {"all": 40}, "b": {"all": 20}, "Global": {"all": 60}},
                         "histogram": {"a": {"all": bins(30, 10, 0)}, "b": {"all": bins(20, 0, 0)},
                                       "Global": {"all": bins(50, 10, 0)}}})
    payloads, glob = read_result(data, ["a", "b", "c"], min_count=5)
    assert payloads["a"]["groups"]["split"] == {"count": 40, "counts": [30, 10, None]}
    assert payloads["b"]["groups"]["split"] == {"count": 20, "counts": [20, None, None]}
    assert glob == {"split": {"count": 60, "counts": [50, 10, None]}}
    assert payloads["c"]["status"] == "failed" and "no answer" in payloads["c"]["message"]


def test_a_sites_report_and_features_are_checked_not_trusted():
    data = result(split={"count": {"a": {"all": 40}, "b": {"all": 40}},
                         "histogram": {"a": {"all": bins(36, 4, 0)},  # 4 < K: refused, never used
                                       "b": {"all": [[0.0, 2.0, 40]]}}},  # not fedcxr's bins
                  evil={"count": {"a": {"all": 1}}, "histogram": {"a": {"all": bins(1)}}})
    payloads, glob = read_result(data, ["a", "b"], min_count=5)
    assert payloads["a"]["groups"] == {} and payloads["b"]["groups"] == {}
    assert "dropped by the server as malformed" in payloads["a"]["message"]
    b = payloads["b"]
    assert b["status"] == "failed" and "x" * 301 not in b["message"] and "\x1b" not in b["message"]
    assert b["unavailable"] == {} and b["image_size"] is None
    assert "evil" not in glob


def test_flare_is_asked_for_every_group_over_its_categories():
    configs = statistic_configs()
    histogram = configs["histogram"]
    assert "count" in configs and "label.pneumonia" in histogram and "intensity" in histogram
    for name, spec in histogram.items():
        assert spec == {"bins": len(G.categories(name)), "range": [0, len(G.categories(name))]}


def test_the_statistics_and_training_jobs_let_idle_clients_ask_again_at_once(tiny_manifests, tmp_path):
    """FLARE's default ``task_request_interval`` (2 s) would cost every site up to 2 s at each task and at
    the job's end; both jobs fedcxr writes set fedcxr's."""
    import json

    from fedcxr.flare import TASK_REQUEST_INTERVAL
    from fedcxr.flare.job import export_job
    from fedcxr.flare.stats_run import export_stats_job
    from fedcxr.pipeline.config import load_config
    from fedcxr.stats.run import StatsOptions

    from ..commands.test_stats import write_config

    cfg = load_config(write_config(tmp_path, tiny_manifests, sites=["nih_style", "chexpert_style"]))
    jobs = [export_stats_job(cfg, StatsOptions(min_count=5, pilot=False), tmp_path / "stats-job"),
            export_job([(cfg, "", False)], tmp_path / "train-job")]
    for job in jobs:
        server = json.loads((job / "app_server" / "config" / "config_fed_server.json").read_text())
        assert server["server"]["task_request_interval"] == TASK_REQUEST_INTERVAL < 2, job.name
