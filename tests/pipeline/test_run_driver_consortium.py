"""A sampled, simulated consortium through the run driver (in-process): metrics.jsonl and run.json say who
was asked, who took part, who missed and why, and the simulated time; a resume ends where the
uninterrupted run ends; FedBN statistics stay at the sites that were not asked and advance at a
late one (it trained)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fedcxr.errors import RunFailed
from fedcxr.pipeline.checkpoints import load_checkpoint, load_final_model
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.participation import sample_sites
from fedcxr.pipeline.run_driver import run_experiment

from ..conftest import tiny_config

SOURCES = ["nih_style", "chexpert_style", "midrc_style", "dicom_style"]
#: seed 0 asks nih+midrc, midrc+dicom, chexpert+dicom (checked below): nih drops out, dicom is always late
SIMULATE = {"step_s": 1.0, "latency_s": {"median": 0.5, "spread": 0.3},
            "sites": {"nih_style": {"dropout": 0.999}, "dicom_style": {"speed": 0.01}}}


def _data(manifests, cache, **overrides):
    settings = dict(strategy="FedAvg", sites=SOURCES, target=None, rounds=3, eval_every=0, simulate=SIMULATE,
                    backbone_aggregation="fedbn", participation={"fraction": 0.5, "deadline_s": 60.0})
    return tiny_config(manifests, cache, **{**settings, **overrides})


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # two tiny runs, three rounds each (~6 s on 2 cores)
def test_a_simulated_sampled_run_records_who_took_part_and_resumes_to_the_same_end(tiny_manifests, tmp_path):
    data = _data(tiny_manifests, tmp_path / "cache")
    draws = [sample_sites(SOURCES, 0.5, 1, 0, r) for r in range(3)]
    assert draws == [["nih_style", "midrc_style"], ["midrc_style", "dicom_style"], ["chexpert_style", "dicom_style"]]
    run = run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    rows = _rows(tmp_path / "run")
    assert [row["asked"] for row in rows] == draws
    assert [list(row["train"]) for row in rows] == [["midrc_style"], ["midrc_style"], ["chexpert_style"]]
    assert [{s: e["why"] for s, e in row["missed"].items()} for row in rows] == [
        {"nih_style": "dropped"}, {"dicom_style": "late"}, {"dicom_style": "late"}]
    assert all(row["simulated"]["round_s"] == 60.0 for row in rows), "a late or dropped site: open to the deadline"
    assert rows[-1]["simulated"]["clock_s"] == 180.0 and rows[1]["simulated"]["late"] == ["dicom_style"]
    assert run["simulated"] == {"clock_s": 180.0, "round_s": [60.0, 60.0, 60.0], "deadline_s": 60.0}
    assert [(e["round"], e["site"], e["why"]) for e in run["missed"]] == [
        (0, "nih_style", "dropped"), (1, "dicom_style", "late"), (2, "dicom_style", "late")]
    # FedBN: a site not asked keeps its statistics; a late site trained, so its own advanced
    ckpt = {r: load_checkpoint(tmp_path / "run" / "checkpoints" / f"round_000{r}.pt")["local_states"] for r in (1, 2)}
    assert _same(ckpt[1]["midrc_style"], ckpt[2]["midrc_style"]) and ckpt[2]["midrc_style"]
    assert not ckpt[2]["nih_style"], "dropped out and never asked again: never trained"
    bn = [k for k in ckpt[2]["dicom_style"] if k.endswith("running_mean")]
    assert bn and not torch.equal(ckpt[1]["dicom_style"][bn[0]], ckpt[2]["dicom_style"][bn[0]])

    shutil.copytree(tmp_path / "run", tmp_path / "resumed")
    for name in ("final_model.pt", "final_model.pt.sha256", "checkpoints/round_0002.pt",
                 "checkpoints/round_0002.pt.sha256"):
        (tmp_path / "resumed" / name).unlink()
    resumed = run_experiment(load_config(data=data), tmp_path / "resumed", resume=True, progress=False)
    one, two = load_final_model(tmp_path / "run"), load_final_model(tmp_path / "resumed")
    assert _same(one["global"], two["global"])
    assert all(_same(one["local_states"][s], two["local_states"][s]) for s in SOURCES)
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # noqa: E731
    assert strip(_rows(tmp_path / "resumed")) == strip(rows)
    assert resumed["simulated"] == run["simulated"] and resumed["missed"] == run["missed"]


def test_a_round_below_min_sites_stops_the_run_saying_who_missed_and_why(tiny_manifests, tmp_path):
    data = _data(tiny_manifests, tmp_path / "cache", rounds=1)
    data["participation"]["min_sites"] = 2
    with pytest.raises(RunFailed, match=r"round 1: only 1 of 2 sites answered 'train' \(need 2, participation"
                                        r".min_sites\); not taking part: nih_style: dropped out of round 1"):
        run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "stopped" and [e["why"] for e in info["missed"]] == ["dropped"]
