"""The README's main command, `fedcxr demo`, end to end (the quick variant keeps CI fast)."""

from __future__ import annotations

import json
import math

from fedcxr.cli import main


def test_demo_quick_runs_end_to_end_and_beats_chance(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--quick", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    run = tmp_path / "demo" / "run"
    assert f"report: {run / 'report.md'}" in out
    report = json.loads((run / "report.json").read_text())
    target = report["sites"]["dicom_style"]
    mean = target["mean_auroc"]["value"] if isinstance(target["mean_auroc"], dict) else target["mean_auroc"]
    assert math.isfinite(mean) and mean > 0.6, mean
    assert (run / "roc_dicom_style.png").stat().st_size > 10_000
    assert (run / "per_class.csv").read_text().startswith("site,class,auroc")
