"""Training curves: metrics.jsonl → per-round series → training_curves.png, linked from report.md."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from fedcxr.errors import UserError
from fedcxr.evaluation import plots
from fedcxr.evaluation.curves import TARGET_LABEL, read_metrics, training_series
from fedcxr.evaluation.report import build_report
from fedcxr.evaluation.report_files import CURVES_FIGURE, write_report, write_training_curves
from fedcxr.evaluation.report_markdown import render_markdown

ROWS = [  # what the run driver writes: three rounds, validation in rounds 0 and 2 only
    {"round": 0, "train": {"a": {"loss": 0.70, "main_loss": 0.70}, "b": {"loss": 0.68}}, "target": {"loss": 0.66},
     "val": {"c": {"mean_auroc": 0.61, "auroc": {"edema": 0.61}, "n": 20}}, "seconds": 1.0},
    {"round": 1, "train": {"a": {"loss": 0.60}, "b": {"loss": float("nan")}}, "target": {"loss": 0.58},
     "val": {}, "seconds": 1.0},
    {"round": 2, "train": {"a": {"loss": 0.50}, "b": {"loss": 0.55}}, "target": {"loss": 0.52},
     "val": {"c": {"mean_auroc": 0.72, "auroc": {}, "n": 20}}, "seconds": 1.0},
]


def _write_metrics(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_series_are_the_rounds_losses_and_validation_aurocs_by_hand():
    series = training_series(ROWS)
    assert series.rounds == 3
    assert series.loss == {"a": [(1, 0.70), (2, 0.60), (3, 0.50)],
                           "b": [(1, 0.68), (3, 0.55)],  # round 2's NaN is a gap, not a point
                           TARGET_LABEL: [(1, 0.66), (2, 0.58), (3, 0.52)]}
    assert series.val_auroc == {"c": [(1, 0.61), (3, 0.72)]}  # rounds without validation are gaps
    assert training_series([{"note": "no round"}]).empty()


def test_read_metrics_names_a_malformed_line(tmp_path):
    assert read_metrics(tmp_path) == []
    (tmp_path / "metrics.jsonl").write_text(json.dumps(ROWS[0]) + "\n\n{not json\n")
    with pytest.raises(UserError, match="line 3 is not valid JSON"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("[1, 2]\n")
    with pytest.raises(UserError, match="line 1 is not a JSON object"):
        read_metrics(tmp_path)


def test_the_figure_is_a_png_of_the_documented_size_and_shows_the_points(tmp_path):
    path = plots.plot_training_curves(training_series(ROWS), tmp_path / "c.png", title="FedAvg: training")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == plots.figure_size("curves", 3)
        pixels = np.asarray(image.convert("RGB")).astype(int)
    colored = (np.abs(pixels - pixels.mean(axis=2, keepdims=True)).sum(axis=2) > 60).sum()
    assert colored > 500  # the coloured lines are drawn (a blank or grey-only figure has none)
    # names are shown literally: a `$` is no mathtext, a leading `_` does not hide the legend entry
    odd = training_series([{"round": 0, "train": {"$x$": {"loss": 1.0}, "__central__": {"loss": 2.0}}}])
    assert plots.plot_training_curves(odd, tmp_path / "odd.png", title="t").is_file()
    assert plots._legend_text("$x$") == r"\$x\$" and plots._legend_text("__central__") == " __central__"


def test_evaluate_writes_the_curves_and_links_them_from_report_md(tmp_path, make_predictions, make_run):
    predictions = make_predictions(sites=("site-a",), patients_per_site=20)
    run = make_run(tmp_path / "run", predictions, method="FedAvg")
    report = build_report(predictions, json.loads((run / "run.json").read_text()), split="test", n_boot=0, seed=0)
    assert write_training_curves(run, "FedAvg") == (
        None, "not drawn: the run directory has no per-round metrics (metrics.jsonl)")
    (run / "metrics.jsonl").write_text("{broken\n")
    assert write_training_curves(run, "FedAvg")[1].startswith("not drawn: metrics.jsonl is malformed")
    assert "Training curves not drawn: metrics.jsonl is malformed" in render_markdown(
        report, curves_note=write_training_curves(run, "FedAvg")[1])

    _write_metrics(run, ROWS)
    names = [p.name for p in write_report(run, report, predictions)]
    md = (run / "report.md").read_text()
    assert CURVES_FIGURE in names and f"![Training loss and validation AUROC per round]({CURVES_FIGURE})" in md
    assert md.index("## Training curves") < md.index("## Site site-a")
