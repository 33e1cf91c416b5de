"""Cross-site evaluation: each site scores the final model on its own split, only summaries come back.

These tests run the server side (:func:`fedcxr.flare.cross_site.cross_site_evaluate`) over the
in-process transport, which calls the very ``validate`` task FLARE's clients run; the FLARE
simulator and POC runs of the same code are in ``test_controller.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcxr.cli import main
from fedcxr.evaluation.compare import compare_runs
from fedcxr.flare.cross_site import SERVER_MODEL, cross_site_evaluate, evaluation_settings
from fedcxr.flare.site_evaluation import SITE_TASKS, VALIDATE_TASK
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
from fedcxr.pipeline.devices import resolve_device

from ..benchmarks.conftest import write_small_npz
from ..conftest import tiny_config

SITES = ["nih_style", "chexpert_style", "midrc_style"]


class DroppingTransport(InProcessTransport):
    """The in-process transport, with one site whose evaluation fails (as FLARE reports it: no reply)."""

    def __init__(self, runners, broken: str):
        super().__init__(runners)
        self.broken = broken
        self.rejected: list[dict] = []

    def run(self, task, targets, params, config, *, per_site=None):
        healthy = [s for s in targets if s != self.broken]
        if len(healthy) < len(targets):
            self.rejected.append({"round": None, "task": task, "site": self.broken,
                                  "reason": "the site failed the task (RuntimeError; details in the site's own log)"})
        return super().run(task, healthy, params, config, per_site=per_site)


def _train(manifests, root: Path, name: str, **overrides):
    cfg = load_config(data=tiny_config(manifests, root / "cache", strategy="FedAvg", sites=SITES, target=None,
                                       rounds=1, eval_every=0, **overrides))
    run_dir = root / name
    run_experiment(cfg, run_dir, progress=False)
    return cfg, run_dir


def _transport(cfg, cls=InProcessTransport, **kwargs):
    return cls(build_runners(cfg, resolve_device("cpu"), False, tasks=SITE_TASKS), **kwargs)


@pytest.fixture(scope="module")
def runs(tiny_manifests, tmp_path_factory):
    root = tmp_path_factory.mktemp("cross_site")
    out = {}
    for name, extra in (("fedavg", {}), ("fedbn", {"backbone_aggregation": "fedbn", "seed": 1})):
        cfg, run_dir = _train(tiny_manifests, root, name, **extra)
        out[name] = (cfg, run_dir)
    return root, out


def test_the_report_is_fedcxr_evaluates_report_built_from_site_summaries(runs):
    root, exps = runs
    cfg, run_dir = exps["fedavg"]
    report = cross_site_evaluate(_transport(cfg), run_dir, evaluation_settings({"n_boot": 30}))
    assert list(report["sites"]) == SITES and report["source"] == "site summaries"
    on_disk = json.loads((run_dir / "report.json").read_text())
    assert on_disk["kind"] == "fedcxr.evaluation.report" and on_disk["ci"]["n_boot"] == 30
    for site in SITES:
        entry = on_disk["sites"][site]
        assert entry["n_rows"] > 0 and set(entry["subgroups"]) == {"sex", "age_bin", "race"}
        assert [r["class"] for r in entry["per_class"]] == on_disk["classes"]
        for row in entry["per_class"]:
            assert {"auroc", "ci_low", "ci_high", "n", "n_pos", "prevalence"} <= set(row)
            if row["auroc"] is not None and row["ci_low"] is not None:
                assert row["ci_low"] <= row["auroc"] <= row["ci_high"]
    frame = pd.read_csv(run_dir / "per_class.csv")
    assert set(frame["site"]) == set(SITES) and len(frame) == len(SITES) * len(on_disk["classes"])
    text = (run_dir / "report.md").read_text()
    assert all(f"## Site {s}" in text for s in SITES)
    matrix = json.loads((run_dir / "cross_site_val" / "cross_val_results.json").read_text())
    assert set(matrix) == set(SITES) and all(set(v) == {SERVER_MODEL} for v in matrix.values())

    # the same AUROCs as `fedcxr evaluate`, which scores the pooled predictions on this machine
    central = root / "central-eval"
    central.mkdir()
    for name in ("run.json", "final_model.pt"):
        (central / name).write_bytes((run_dir / name).read_bytes())
    assert main(["evaluate", str(central), "--bootstrap", "0"]) == 0
    reference = json.loads((central / "report.json").read_text())
    for site in SITES:
        ours = [r["auroc"] for r in on_disk["sites"][site]["per_class"]]
        theirs = [r["auroc"] for r in reference["sites"][site]["per_class"]]
        assert np.allclose(np.array(ours, dtype=float), np.array(theirs, dtype=float), equal_nan=True, atol=1e-6)
        assert on_disk["sites"][site]["n_rows"] == reference["sites"][site]["n_rows"]


def test_a_site_that_fails_is_named_and_the_others_are_reported(runs):
    _, exps = runs
    cfg, run_dir = exps["fedavg"]
    report = cross_site_evaluate(_transport(cfg, DroppingTransport, broken="chexpert_style"), run_dir,
                                 evaluation_settings({"n_boot": 0}))
    assert list(report["sites"]) == ["nih_style", "midrc_style"]
    failed = {item["site"]: item["reason"] for item in report["sites_without_predictions"]}
    assert list(failed) == ["chexpert_style"] and "RuntimeError" in failed["chexpert_style"]
    assert "Site chexpert_style: not evaluated (evaluation failed" in (run_dir / "report.md").read_text()


class LyingTransport(InProcessTransport):
    """The in-process transport, with one site whose summary no evaluation can produce (SECURITY.md E4)."""

    def __init__(self, runners, liar: str):
        super().__init__(runners)
        self.liar = liar

    def run(self, task, targets, params, config, *, per_site=None):
        replies = super().run(task, targets, params, config, per_site=per_site)
        summary = (replies[self.liar].metrics or {}).get("summary") if self.liar in replies else None
        if task == VALIDATE_TASK and summary:
            summary["per_class"][0]["auroc"] = 42.0
            summary["per_class"][-1]["reason"] = '=HYPERLINK("http:evil","click")'
        return replies


def test_a_summary_with_impossible_numbers_or_unknown_text_is_refused_and_logged(runs, caplog):
    _, exps = runs
    cfg, run_dir = exps["fedavg"]
    with caplog.at_level("WARNING", logger="fedcxr.flare.cross_site"):
        report = cross_site_evaluate(_transport(cfg, LyingTransport, liar="nih_style"), run_dir,
                                     evaluation_settings({"n_boot": 0}))
    assert list(report["sites"]) == ["chexpert_style", "midrc_style"]
    failed = {item["site"]: item["reason"] for item in report["sites_without_predictions"]}
    assert failed["nih_style"].startswith("summary refused: summary.per_class[0].auroc: 42.0 is outside [0, 1]")
    assert "site nih_style not reported: summary refused" in caplog.text
    for name in ("per_class.csv", "report.md", "report.json", "cross_site_val/cross_val_results.json"):
        assert "HYPERLINK" not in (run_dir / name).read_text(), name
    assert "nih_style" not in json.loads((run_dir / "cross_site_val" / "cross_val_results.json").read_text())


def test_per_site_methods_evaluate_the_sites_own_model_and_the_global_one(runs):
    _, exps = runs
    cfg, run_dir = exps["fedbn"]
    report = cross_site_evaluate(_transport(cfg), run_dir, evaluation_settings({"n_boot": 0}))
    models = report["cross_site"]["models"]
    assert set(models) == {SERVER_MODEL, *SITES}
    assert all(set(models[s]) == {s} for s in SITES), "a site's own model is scored on that site only"
    assert set(models[SERVER_MODEL]) == set(SITES)
    assert report["cross_site"]["deployed_model"] == {s: s for s in SITES}
    own = [models[s][s]["mean_auroc"] for s in SITES]
    assert own != [models[SERVER_MODEL][s]["mean_auroc"] for s in SITES], "local BN statistics change the scores"
    assert "## Cross-site matrix" in (run_dir / "report.md").read_text()


def test_fedcxr_report_builds_the_table_from_summary_reports(runs, tmp_path):
    _, exps = runs
    for name in ("fedavg", "fedbn"):
        cfg, run_dir = exps[name]
        cross_site_evaluate(_transport(cfg), run_dir, evaluation_settings({"n_boot": 20}))
    dirs = [str(exps[n][1]) for n in ("fedavg", "fedbn")]
    result = compare_runs(dirs, n_boot=20)  # two seeds of FedAvg (one with FedBN): mean ± SD over seeds
    assert [c["site"] for c in result["columns"]] == SITES
    row = result["table"][0]
    reports = [json.loads((exps[n][1] / "report.json").read_text()) for n in ("fedavg", "fedbn")]
    for site in SITES:
        values = [r["sites"][site]["mean_auroc"] for r in reports]
        assert row["cells"][site]["n_runs"] == 2 and row["cells"][site]["seeds"] == [0, 1]
        assert row["cells"][site]["auroc_mean"] == pytest.approx(np.mean(values))
        assert row["cells"][site]["auroc_sd"] == pytest.approx(np.std(values, ddof=1))
    out = tmp_path / "cmp"
    assert main(["report", *dirs, "--out", str(out)]) == 0
    assert (out / "comparison.md").is_file()


def test_the_validate_task_replies_with_a_summary_only(runs):
    from fedcxr.flare.wire import check_summary, decode_reply, encode_reply

    _, exps = runs
    cfg, run_dir = exps["fedavg"]
    final = __import__("torch").load(run_dir / "final_model.pt", weights_only=True)
    transport = _transport(cfg)
    reply = transport.run(VALIDATE_TASK, ["nih_style"], final["global"],
                          {"classes": final["classes"], "aux_tasks": final["aux_tasks"], "split": "test",
                           "n_boot": 10, "seed": 0, "model_owner": SERVER_MODEL})["nih_style"]
    assert reply.params is None and not reply.extra
    check_summary(reply.metrics)
    params, meta = encode_reply(reply)
    assert params == {}
    decoded = decode_reply("nih_style", params, meta, task=VALIDATE_TASK)
    assert decoded.metrics["summary"]["n_rows"] == reply.metrics["summary"]["n_rows"]


@pytest.mark.shared
def test_real_pneumoniamnist_sites_report_the_same_aurocs_as_fedcxr_evaluate(shared_data, tmp_path):
    """Real X-rays (PneumoniaMNIST, split into two hospitals): summaries from the sites = central scoring.

    A slice of the real file: the whole official test split (621 images, ~310 per site, what the
    AUROCs are compared on) and the first 300/60 train/val images (the run trains 3 steps of 32);
    ingesting all 5,835 images cost most of this test's time and checked nothing more."""
    npz = write_small_npz(shared_data, tmp_path / "pneumoniamnist_slice.npz", {"train": 300, "val": 60, "test": 621})
    manifests = tmp_path / "manifests"
    assert main(["ingest", "medmnist", "--input", str(npz), "--out", str(manifests), "--site-by", "iid:2",
                 "--quiet"]) == 0
    sites = sorted(p.name for p in manifests.iterdir() if (p / "manifest.parquet").is_file())
    assert len(sites) == 2
    cfg = load_config(data=tiny_config(manifests, tmp_path / "cache", strategy="FedAvg", sites=sites, target=None,
                                       rounds=1, eval_every=0, image_size=28,
                                       source={"lr": 2e-3, "batch_size": 32, "steps": 3}))
    run_dir = tmp_path / "run"
    run_experiment(cfg, run_dir, progress=False)
    report = cross_site_evaluate(_transport(cfg), run_dir, evaluation_settings({"n_boot": 50}))
    assert report["classes"] == ["pneumonia"] and report["binary_task"]
    # the central evaluation beside it (the cross-site report is moved aside, never overwritten): compare
    assert main(["evaluate", str(run_dir), "--bootstrap", "0", "--replace-cross-site"]) == 0
    assert json.loads((run_dir / "cross_site_report" / "report.json").read_text())["sites"].keys() == set(sites)
    central = json.loads((run_dir / "report.json").read_text())
    for site in sites:
        ours, theirs = report["sites"][site], central["sites"][site]
        assert ours["n_rows"] == theirs["n_rows"] > 250
        assert ours["per_class"][0]["auroc"] == pytest.approx(theirs["per_class"][0]["auroc"], abs=1e-6)
        assert ours["per_class"][0]["ci_low"] < ours["per_class"][0]["auroc"] < ours["per_class"][0]["ci_high"]
        assert ours["accuracy"] == pytest.approx(theirs["accuracy"], abs=1e-9)


def test_a_site_summary_carries_the_small_sample_flag_through_the_wire_and_into_the_matrix(tmp_path):
    """Pure functions, no training: a site with 2 positives summarises, the wire and the server accept
    the flag, and the cross-site matrix and FLARE's cross_val_results.json count the small classes."""
    from fedcxr.evaluation.summary_check import summary_problem
    from fedcxr.flare.cross_site import _cell, write_cross_val_results
    from fedcxr.flare.site_evaluation import summarize
    from fedcxr.flare.wire import check_summary, plain

    rng = np.random.default_rng(0)
    n = 40
    frame = pd.DataFrame({"site": "nih_style", "row_key": [f"r{i}" for i in range(n)],
                          "patient_key": [f"p{i // 2}" for i in range(n)],
                          "label__edema": np.r_[np.ones(2), np.zeros(n - 2)], "prob__edema": rng.uniform(size=n),
                          "label__effusion": np.tile([1.0, 0.0], n // 2), "prob__effusion": rng.uniform(size=n)})
    summary = summarize(frame, ["edema", "effusion"], split="test", n_boot=50, seed=0)
    metrics = plain({"split": "test", "model_owner": SERVER_MODEL, "n": n, "summary": summary})
    check_summary(metrics)  # the wire lets the flag and the method through
    assert summary_problem(metrics["summary"], ["edema", "effusion"]) is None
    edema, effusion = metrics["summary"]["per_class"]
    assert edema["small_sample"] is True and edema["ci_method"] == "Newcombe score"
    assert effusion["small_sample"] is False and (effusion["pos_patients"], effusion["neg_patients"]) == (20, 20)
    cell = _cell(metrics)
    assert (cell["small_sample_classes"], cell["n_classes"]) == (1, 2)
    path = write_cross_val_results(tmp_path, {SERVER_MODEL: {"nih_style": cell}})
    assert json.loads(path.read_text())["nih_style"][SERVER_MODEL]["val_small_sample_classes"] == 1
