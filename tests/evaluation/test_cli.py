"""``fedcxr evaluate`` and ``fedcxr report`` through the real command line (exit codes, messages)."""

from __future__ import annotations

import json
import sys
import types

import pandas as pd
import pytest

from fedcxr.cli import main
from fedcxr.workflows.evaluate import evaluate_run


def test_evaluate_writes_report_and_prints_mean_auroc(tmp_path, make_predictions, make_run, capsys):
    run = make_run(tmp_path / "run", make_predictions(), method="FedAvg")
    assert main(["evaluate", str(run), "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert f"report: {run / 'report.md'}" in out
    report = json.loads((run / "report.json").read_text())
    for site in ("site-a", "site-b"):
        mean = report["sites"][site]["mean_auroc"]
        assert f"  {site}: mean AUROC {mean:.3f} (" in out
        assert (run / f"roc_{site}.png").is_file()
    assert (run / "per_class.csv").is_file()
    assert report["ci"]["n_boot"] == 50


def test_evaluate_asks_training_for_missing_predictions(tmp_path, make_predictions, make_run, monkeypatch, capsys):
    run = make_run(tmp_path / "run", None, method="FedAvg")
    calls = []

    def write_predictions(run_dir, split, device=None):
        calls.append((run_dir, split, device))
        path = run_dir / "predictions" / f"{split}.parquet"
        path.parent.mkdir(exist_ok=True)
        make_predictions(sites=("site-a",)).to_parquet(path)
        return path

    fake = types.ModuleType("fedcxr.pipeline.predictions")
    fake.write_predictions = write_predictions
    monkeypatch.setitem(sys.modules, "fedcxr.pipeline.predictions", fake)
    assert main(["evaluate", str(run), "--split", "val", "--bootstrap", "0", "--device", "cpu"]) == 0
    assert calls == [(run, "val", "cpu")]
    assert json.loads((run / "report.json").read_text())["split"] == "val"


def test_evaluate_bad_run_dirs_exit_2_with_clear_message(tmp_path, make_predictions, make_run, capsys):
    assert main(["evaluate", str(tmp_path / "nowhere")]) == 2
    assert "no such run directory" in capsys.readouterr().err

    (tmp_path / "empty").mkdir()
    assert main(["evaluate", str(tmp_path / "empty")]) == 2
    assert "no run.json" in capsys.readouterr().err

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    assert main(["evaluate", str(broken)]) == 2
    assert "run.json: not valid JSON" in capsys.readouterr().err

    (broken / "run.json").write_text(json.dumps({"method": "FedAvg", "seed": 0}))
    assert main(["evaluate", str(broken)]) == 2
    assert "run.json: missing key 'classes'" in capsys.readouterr().err

    frame = make_predictions().drop(columns=["prob__edema"])
    run = make_run(tmp_path / "nocol", frame)
    assert main(["evaluate", str(run)]) == 2
    assert "test.parquet: missing column(s) prob__edema" in capsys.readouterr().err

    frame = make_predictions()
    frame.loc[5, "prob__cardiomegaly"] = 3.2  # a logit where a probability belongs
    run = make_run(tmp_path / "logit", frame)
    assert main(["evaluate", str(run)]) == 2
    assert "column prob__cardiomegaly row 5: probability must be in [0, 1], got 3.2" in capsys.readouterr().err


def test_report_compares_runs(tmp_path, make_predictions, make_run, capsys):
    a = make_run(tmp_path / "a", make_predictions(skill=1.0), method="FedAvg")
    b = make_run(tmp_path / "b", make_predictions(skill=2.5, model_seed=1), method="FedBN")
    out = tmp_path / "cmp"
    assert main(["report", str(a), str(b), "--out", str(out), "--baseline", "FedAvg"]) == 0
    assert f"{out / 'comparison.md'}" in capsys.readouterr().out
    table = pd.read_csv(out / "comparison.csv")
    assert table.loc[table["best_auroc"], "method"].unique().tolist() == ["FedBN"]
    assert main(["report", str(a), "--out", str(out), "--baseline", "FedProx"]) == 2
    assert "--baseline 'FedProx' is not among the methods" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing"), "--out", str(out)]) == 2


def test_evaluate_accepts_nullable_labels_and_float32_probs(tmp_path, make_predictions, make_run):
    frame = make_predictions(sites=("site-a",))
    for cls in ("atelectasis", "edema"):
        frame[f"label__{cls}"] = frame[f"label__{cls}"].astype("Float64")  # NaN → <NA>
        frame[f"prob__{cls}"] = frame[f"prob__{cls}"].astype("float32")
    run = make_run(tmp_path / "run", frame)
    assert main(["evaluate", str(run), "--bootstrap", "20"]) == 0
    saved = json.loads((run / "report.json").read_text())["sites"]["site-a"]["per_class"]
    edema = next(r for r in saved if r["class"] == "edema")
    assert edema["n"] == int(frame["label__edema"].notna().sum()) and 0.5 < edema["auroc"] <= 1


def test_evaluate_run_returns_the_report(tmp_path, make_predictions, make_run):
    """The Python entry point used by ``fedcxr demo`` and ``fedcxr sweep``."""
    run = make_run(tmp_path / "run", make_predictions(), method="FedBN", target="site-b")
    report = evaluate_run(run, split="test", n_boot=0)
    assert report["target"] == "site-b" and 0.5 < report["sites"]["site-b"]["mean_auroc"] <= 1
    assert json.loads((run / "report.json").read_text())["sites"]["site-b"]["mean_auroc"] == pytest.approx(
        report["sites"]["site-b"]["mean_auroc"])
