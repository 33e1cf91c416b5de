"""``fedcxr stats --flare simulate``: FLARE's federated statistics workflow gives the in-process numbers.

One simulator job (~20–40 s here, hence ``slow``) over four sites: two whole sources, a source
whose images are gone (it fails mid-way: its manifest is counted, its headers and cache are
not) and a source whose manifest is garbage (it fails at once); target ``dicom_style``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("nvflare")

from fedcxr.pipeline.config import load_config  # noqa: E402
from fedcxr.stats.run import StatsOptions, collect_in_process, run_stats  # noqa: E402

from ..commands.test_stats import copy_site, write_config  # noqa: E402

K = 5


@pytest.mark.slow
def test_flare_simulator_matches_in_process_and_no_count_below_k_leaves_a_site(tiny_manifests, tmp_path):
    from fedcxr.flare.stats_run import run_flare_stats

    bad = tmp_path / "bad"
    gone = copy_site(tiny_manifests / "midrc_style", bad / "midrc_gone", export_root=tmp_path / "nowhere")
    broken = bad / "broken"
    shutil.copytree(tiny_manifests / "nih_style", broken)
    (broken / "manifest.parquet").write_bytes(b"garbage")
    config = load_config(write_config(tmp_path, tiny_manifests,
                                      sites=["nih_style", "chexpert_style", str(gone), str(broken)]))
    options = StatsOptions(min_count=K, pilot=False)
    local = run_stats(config, tmp_path / "in-process", options)
    flare_dir = tmp_path / "flare-run" / "flare"
    remote = run_stats(config, tmp_path / "flare-run", options, transport="NVIDIA FLARE simulate",
                       collect=lambda cfg, opts: run_flare_stats(cfg, flare_dir, opts, mode="simulate", timeout=600))

    assert remote["global"] == local["global"], "FLARE's sums are the in-process sums"
    assert remote["sites"] == local["sites"] and remote["shift"] == local["shift"]
    assert remote["advice"] == local["advice"]
    assert local["sites"]["midrc_gone"]["status"] == "partial"
    assert remote["sites"]["broken"]["status"] == "failed"
    assert "manifest or site.json unreadable" in remote["sites"]["broken"]["message"]

    # what each site sent, as its own recorder wrote it after FLARE's privacy filter
    sent_payloads = collect_in_process(config, options)
    for site in ("nih_style", "chexpert_style", "midrc_gone", "dicom_style"):
        records = [json.loads(line)["sent"] for line in (flare_dir / "sent" / f"{site}.jsonl").read_text().splitlines()]
        handshake = next(r["handshake"] for r in records if "handshake" in r)
        assert set(handshake) <= {"version", "site", "status", "message", "unavailable", "privacy", "image_size"}
        for record in (r for r in records if "statistics" in r):
            statistics = record["statistics"]
            for feature, total in statistics["count"]["all"].items():
                assert total == 0 or total >= K, (site, feature, total)
            for feature, bins in (statistics.get("histogram") or {}).get("all", {}).items():
                sent = [b[2] for b in bins]
                assert all(v == 0 or v >= K for v in sent), (site, feature)
                released = sent_payloads[site]["groups"][feature]["counts"]
                assert [v or None for v in sent] == released, "a 0 on FLARE's wire is exactly a suppressed cell"
    broken_sent = [json.loads(line)["sent"] for line in (flare_dir / "sent" / "broken.jsonl").read_text().splitlines()]
    assert [r["handshake"]["status"] for r in broken_sent if "handshake" in r] == ["failed"]
    assert all(not any(by_ds for by_ds in r["statistics"].values()) for r in broken_sent if "statistics" in r), \
        "a failed site sends no statistic at all"
    logs = "\n".join(p.read_text(errors="replace") for p in (flare_dir / "logs").rglob("log*.txt"))
    assert "site broken: cannot read its manifest" in logs, "the full reason stays in the site's own log"
    assert not (flare_dir / "simulator").exists(), "the simulator workspace is removed"
    assert Path(flare_dir / "result" / "fedcxr_stats.json").is_file()
