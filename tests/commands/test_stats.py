"""``fedcxr stats`` in-process on a tiny synthetic federation, and on bad sites."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from fedcxr.cli import main
from fedcxr.pipeline.config import load_config
from fedcxr.site_adapters.manifest import read_manifest, read_site_json, write_site
from fedcxr.stats.release import check_payload
from fedcxr.stats.run import StatsOptions, collect_in_process

from ..conftest import tiny_config

K = 5


def write_config(tmp_path: Path, manifests: Path, **overrides) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(manifests, tmp_path / "cache", **overrides)))
    return path


def every_count(node, counted=False):
    """Every value under a ``count``/``counts`` key, anywhere in ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from every_count(value, counted or key in ("count", "counts"))
    elif isinstance(node, list):
        for value in node:
            yield from every_count(value, counted)
    elif counted:
        yield node


@pytest.fixture(scope="module")
def stats_run(tiny_manifests, tmp_path_factory):
    """The whole command with its pilot round (about 5–8 s here: the tests using it are slow)."""
    tmp = tmp_path_factory.mktemp("stats")
    config = write_config(tmp, tiny_manifests, sites=["nih_style", "chexpert_style", "midrc_style"])
    out = tmp / "out"
    assert main(["-q", "stats", str(config), "--out", str(out), "--device", "cpu"]) == 0
    return config, out, json.loads((out / "stats.json").read_text())


def test_no_count_below_k_in_what_the_sites_send(tiny_manifests, tmp_path):
    config = load_config(write_config(tmp_path, tiny_manifests, sites=["nih_style", "chexpert_style",
                                                                         "midrc_style"]))
    payloads = collect_in_process(config, StatsOptions(min_count=K, pilot=False))
    assert set(payloads) == {"nih_style", "chexpert_style", "midrc_style", "dicom_style"}
    for site, payload in payloads.items():
        check_payload(payload, K, where=site)
        values = list(every_count(payload))
        assert values and all(v is None or (isinstance(v, int) and v >= K) for v in values), site
        assert any(v is None for v in values), "this tiny federation has small cells: some must be suppressed"
        assert set(payload) == {"version", "site", "privacy", "image_size", "unavailable", "groups", "status",
                                "message"}, "nothing but counts, a status and the privacy settings is sent"


@pytest.mark.slow
def test_stats_writes_every_section_figure_and_page_and_what_the_sites_sent(stats_run):
    config, out, stats = stats_run
    assert {"sites", "global", "min_count", "shift", "advice"} <= set(stats) and stats["min_count"] == K
    for name in ("prevalence", "pyramids", "intensity", "distances"):
        assert (out / f"{name}.png").stat().st_size > 10_000, name
        assert f"]({name}.png)" in (out / "stats.md").read_text()
    split = stats["global"]["groups"]["split"]
    assert split["count"] == 4 * 48 and split["categories"] == ["train", "val", "test"]
    quantiles = stats["global"]["derived"]["intensity_quantiles"]
    assert 0 <= quantiles["p05"] <= quantiles["p50"] <= quantiles["p95"] <= 1
    payloads = collect_in_process(load_config(config), StatsOptions(min_count=K, pilot=False))
    for site, payload in payloads.items():  # what is written is what was sent
        assert {n: {k: g[k] for k in ("count", "counts")} for n, g in stats["sites"][site]["groups"].items()} \
            == payload["groups"]
    assert all(v is None or v >= K for v in every_count(stats["global"]))


@pytest.mark.slow
def test_the_advice_names_its_evidence_and_the_pilot_numbers(stats_run):
    _, out, stats = stats_run
    advice, pilot = stats["advice"], stats["shift"]["pilot"]
    assert advice["target"] == "dicom_style"
    assert set(advice["inputs"]) == {"shift_type", "target_labels", "rounds", "pilot"}
    assert advice["inputs"]["rounds"] == {"value": 2, "from": "the config's rounds"}
    assert advice["inputs"]["shift_type"]["value"] in ("pixel", "none")
    assert advice["map"]["cells"] >= 1 and len(advice["map"]["sha256"]) == 64
    assert advice["verdict"] in ("resolved", "unresolved: run a sweep", "no cell close enough")
    assert advice["recommendation"] is None or (advice["verdict"] == "resolved" and advice["cell"]["resolved"])
    assert pilot["status"] == "ok" and pilot["method"] == "FedGP_Auto" and pilot["target_batches"] >= 2
    for source in ("nih_style", "chexpert_style", "midrc_style"):
        entry = pilot["sources"][source]
        assert math.isfinite(entry["tau2d2"]) and 0 <= entry["beta_fedgp"] <= 1
    assert pilot["sigma2"] > 0
    page = (out / "stats.md").read_text()
    assert "## Advice" in page
    assert "nih_style" in page and "nih\\_style" not in page and "\\(" not in page, "names read as written"
    # the tiny target gives 2 batch updates a round: the FedGP_Auto pilot's warning, labelled as the pilot's
    assert any("nothing to change for your FedAvg_Finetune run" in n for n in pilot["notes"])


# --------------------------------------------------------------------------- bad input


def copy_site(src: Path, dest: Path, frame=None, *, export_root=None) -> Path:
    meta = read_site_json(src)
    write_site(dest.parent, dest.name, read_manifest(src) if frame is None else frame,
               classes=meta["class_set"], source=meta["source"], adapter_version=meta["adapter_version"],
               export_root=Path(export_root or meta["export_root"]), set_aside=[], options=meta.get("options", {}))
    return dest


def test_bad_sites_each_get_a_clear_status_and_the_others_still_count(tiny_manifests, tmp_path, capsys):
    bad = tmp_path / "bad"
    nih = read_manifest(tiny_manifests / "nih_style")
    empty = copy_site(tiny_manifests / "nih_style", bad / "empty", nih.iloc[:0])
    few = copy_site(tiny_manifests / "nih_style", bad / "few", nih.loc[nih["split"] == "train"].iloc[:7])
    hostile = copy_site(tiny_manifests / "chexpert_style", bad / "no|images$x", export_root=tmp_path / "gone")
    broken = bad / "broken"
    shutil.copytree(tiny_manifests / "midrc_style", broken)
    (broken / "manifest.parquet").write_bytes(b"not a parquet file")
    config = write_config(tmp_path, tiny_manifests, sites=["nih_style", str(empty), str(few), str(hostile),
                                                            str(broken)], target="dicom_style")
    out = tmp_path / "out"
    assert main(["-q", "stats", str(config), "--out", str(out), "--no-pilot"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    sites = stats["sites"]
    assert sites["nih_style"]["status"] == "ok" and sites["dicom_style"]["status"] == "ok"
    assert sites["empty"]["status"] == "suppressed" and sites["empty"]["groups"] == {}
    assert "fewer than 5 rows" in sites["empty"]["message"]
    assert sites["few"]["status"] == "ok" and sites["few"]["groups"]["split"]["counts"] == [7, None, None]
    assert "cells suppressed (below 5 or beside one)" in sites["few"]["message"]
    assert sites["no|images$x"]["status"] == "partial"
    assert set(sites["no|images$x"]["unavailable"]) == {"acquisition", "intensity"}
    assert "not reachable" in sites["no|images$x"]["unavailable"]["acquisition"]
    assert sites["broken"]["status"] == "failed" and "unreadable" in sites["broken"]["message"]
    assert str(tmp_path) not in json.dumps(stats), "no path of this machine in stats.json"
    assert stats["global"]["sites"] == ["nih_style", "few", "no|images$x", "dicom_style"]
    page = (out / "stats.md").read_text()
    assert "no\\|images\\$x" in page and "| no|images" not in page, "a site name cannot break a table"
    printed = capsys.readouterr().out
    assert "broken" in printed and "failed" in printed


def test_without_building_the_cache_the_intensity_section_says_why(tiny_manifests, tmp_path):
    config = write_config(tmp_path, tiny_manifests, sites=["nih_style"], target=None)
    shutil.rmtree(tmp_path / "cache")  # tiny_config seeds the test's cache from the session's: start without one
    out = tmp_path / "out"
    assert main(["-q", "stats", str(config), "--out", str(out), "--no-cache-build", "--no-headers"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    entry = stats["sites"]["nih_style"]
    assert entry["status"] == "partial" and "intensity" not in entry["groups"]
    assert "--no-cache-build" in entry["unavailable"]["intensity"]
    assert stats["advice"]["verdict"] == "no target" and stats["advice"]["recommendation"] is None
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("nih_style*"))


def test_a_bad_min_count_is_a_usage_error(tiny_manifests, tmp_path, capsys):
    config = write_config(tmp_path, tiny_manifests)
    assert main(["stats", str(config), "--out", str(tmp_path / "o"), "--min-count", "0"]) == 2
    assert "--min-count" in capsys.readouterr().err


def test_a_full_disk_replaces_nothing_and_advises_what_stats_can_do(tiny_manifests, tmp_path, capsys):
    from ..hostile.test_run_directories import file_size_limit

    config = write_config(tmp_path, tiny_manifests, sites=["nih_style", "chexpert_style"], target=None)
    out = tmp_path / "out"
    args = ["stats", str(config), "--out", str(out), "--no-pilot", "--no-headers"]
    assert main(["-q", *args]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"stats.json", "stats.md", "prevalence.png"} <= set(before)
    limit = len(before["prevalence.png"]) + 2_000  # the first file written fits, a later one does not
    assert limit < max(len(data) for name, data in before.items() if name != "prevalence.png")
    with file_size_limit(limit):
        code = main(["-q", *args, "--min-count", "6"])  # other numbers: any replaced file would differ
    err = capsys.readouterr().err
    assert code == 1 and "no space left writing" in err and "Traceback" not in err
    assert "--resume" not in err and "checkpoints" not in err and "run `fedcxr stats` again" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "all or nothing: the old outputs, whole"
    assert main(["-q", *args, "--min-count", "6"]) == 0
    assert json.loads((out / "stats.json").read_text())["min_count"] == 6
    assert not list(out.glob(".stats-*")), "no staging folder left behind"
