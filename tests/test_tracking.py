"""Experiment tracking: TensorBoard event files of a run hold its per-round numbers, nothing else."""

from __future__ import annotations

import math

import pytest

from fedcxr.cli import main
from fedcxr.errors import UserError
from fedcxr.pipeline.config import config_fingerprint, load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.tracking import check_tag, default_backend, make_tracker, round_scalars

from .conftest import tiny_config

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

SOURCES = ["nih_style", "chexpert_style"]


def scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in RUN_DIR/tensorboard as ``{tag: [(step, value)]}`` (read back by TensorBoard itself)."""
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_fedda_run_writes_losses_validation_auroc_and_betas_per_round_and_site(tiny_manifests, tmp_path):
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy="FedDA", rounds=2,
                                       tracking="tensorboard", eval_sites=[*SOURCES, "dicom_style"], warmup_rounds=0))
    run_dir = tmp_path / "run"
    run_experiment(cfg, run_dir, progress=False)
    found = scalars(run_dir)
    for site in SOURCES:
        assert [step for step, _ in found[f"train/{site}/loss"]] == [0, 1]
        betas = found[f"beta/{site}"]
        assert [step for step, _ in betas] == [0, 1] and all(0 <= b <= 1 for _, b in betas)
    assert [step for step, _ in found["target/loss"]] == [0, 1]
    # the same numbers as metrics.jsonl
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for step, value in found["beta/nih_style"]:
        assert value == pytest.approx(rows[step]["betas"]["nih_style"], rel=1e-6)
    tracked = 0
    for row in rows:  # every defined validation AUROC is tracked (an undefined one, NaN, is not)
        for site, val in row["val"].items():
            points = dict(found.get(f"val/{site}/mean_auroc", []))
            if val["mean_auroc"] is None or math.isnan(val["mean_auroc"]):
                assert row["round"] not in points
            else:
                assert points[row["round"]] == pytest.approx(val["mean_auroc"], rel=1e-6)
                tracked += 1
    assert tracked == sum(v["mean_auroc"] is not None and not math.isnan(v["mean_auroc"])
                          for r in rows for v in r["val"].values())
    allowed = {"train", "target", "beta", "val", "round", "loss", "main_loss", "aux_loss", "mean_auroc", "auroc",
               "seconds", "dicom_style", *SOURCES, *rows[0]["val"]["dicom_style"]["auroc"]}
    assert {part for tag in found for part in tag.split("/")} <= allowed, "tags are fixed words, sites, classes"


def test_validation_aurocs_per_site_and_class_are_read_back_by_tensorboard(tmp_path):
    metrics = {"round": 3, "val": {"site_a": {"mean_auroc": 0.75, "auroc": {"edema": 0.7, "pneumonia": 0.8}},
                                   "site_b": {"mean_auroc": float("nan"), "auroc": {"edema": float("nan")}}},
               "betas": {"site_a": 0.25}, "seconds": 1.5}
    with make_tracker("tensorboard", tmp_path) as tracker:
        tracker.log_round(metrics)
    found = scalars(tmp_path)
    assert set(found) == {"val/site_a/mean_auroc", "val/site_a/auroc/edema", "val/site_a/auroc/pneumonia",
                          "beta/site_a", "round/seconds"}
    assert found["val/site_a/auroc/pneumonia"] == [(3, pytest.approx(0.8))]


def test_tracking_none_writes_no_event_files_and_does_not_change_the_fingerprint(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FedAvg", target=None, rounds=1, eval_every=0)
    cfg = load_config(data={**data, "tracking": "none"})
    assert config_fingerprint(cfg) == config_fingerprint(load_config(data=data)), "resume across tracking choices"
    run_experiment(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "tensorboard").exists()
    assert default_backend() == "tensorboard"  # installed here: the default


def test_a_bad_tracking_value_is_named(tiny_manifests, tmp_path):
    import yaml

    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache", tracking="wandb")))
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 2


def test_mlflow_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(UserError, match="mlflow is not installed"):
        make_tracker("mlflow", tmp_path)


def test_no_path_or_id_becomes_a_tag():
    metrics = {"round": 0, "train": {"../../etc/passwd": {"loss": 1.0}, "site_a": {"loss": float("nan")}},
               "val": {"site_a": {"mean_auroc": 0.7, "auroc": {"edema": 0.7}}},
               "betas": {"9f86d081884c7d659a2feaa0c55ad015": 0.3}}
    tags = dict(round_scalars(metrics))
    train = [t for t in tags if t.startswith("train/")]
    assert len(train) == 1 and len(train[0].split("/")) == 3 and ".." not in train[0], train
    assert not any("9f86d081884c7d65" in t for t in tags), "a hex id is never tracked"
    assert tags["val/site_a/mean_auroc"] == 0.7 and "train/site_a/loss" not in tags  # NaN: not tracked
    with pytest.raises(ValueError):
        check_tag("train/a\\b/loss")
    assert all(math.isfinite(v) for v in tags.values())


def test_every_site_task_that_trains_streams_its_losses():
    """A FLARE site streams its losses after every task that trains (SCAFFOLD's is train_scaffold): each
    task says so itself (``SiteTask.streams``), in the method module that declares it."""
    from fedcxr.pipeline.protocols.methods import site_tasks
    from fedcxr.pipeline.site_runner import TASKS
    from fedcxr.tracking import site_scalars

    tasks = {**TASKS, **site_tasks()}
    streaming = {name for name, task in tasks.items() if task.streams == "train"}
    assert {"train", "train_gp", "train_combine", "train_scaffold", "train_prox", "train_from_warm", "fact_head",
            "finetune_pass", "train_ditto", "train_fedrep", "train_apfl"} <= streaming
    assert "fact_target" not in streaming and "warmup_head" not in streaming  # IDD values, validation losses
    for name in streaming:
        assert tasks[name].changes_state, name
        assert list(site_scalars(tasks[name].streams, {"loss": 0.5, "scaffold_steps": 4})) == [("train/loss", 0.5)]
    assert list(site_scalars(TASKS["evaluate"].streams, {"mean_auroc": 0.7})) == [("val/mean_auroc", 0.7)]
    assert list(site_scalars(None, {"loss": 0.5})) == []
