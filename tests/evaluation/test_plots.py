"""ROC and reliability figures: valid PNGs of the documented size, safe file names."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedcxr.evaluation import plots
from fedcxr.evaluation.report import build_report
from fedcxr.evaluation.report_files import figure_names, safe_name, write_report


def _open_png(path):
    with Image.open(path) as image:
        image.verify()  # raises on a truncated or corrupt file
    with Image.open(path) as image:
        return image.format, image.size


@pytest.mark.parametrize("plot,kind", [(plots.plot_roc, "roc"), (plots.plot_reliability, "reliability")])
def test_figures_are_pngs_of_the_documented_size(tmp_path, make_predictions, plot, kind):
    frame = make_predictions(sites=("site-a",))
    classes = ["atelectasis", "edema", "hernia"]
    path = plot(frame, classes, tmp_path / f"{kind}.png", title="t")
    assert path == tmp_path / f"{kind}.png"
    assert _open_png(path) == ("PNG", plots.figure_size(kind, 3))
    assert plots.figure_size(kind, 3)[0] >= 600 and plots.figure_size(kind, 3)[1] >= 500
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left no temporary behind


@pytest.mark.parametrize("plot,kind", [(plots.plot_roc, "roc"), (plots.plot_reliability, "reliability")])
def test_many_classes_widen_the_figure(tmp_path, make_predictions, plot, kind):
    classes = [f"c{i:02d}" for i in range(12)]
    frame = make_predictions(sites=("site-a",), classes=classes, all_negative=())
    path = plot(frame, classes, tmp_path / "many.png", title="t")
    size = plots.figure_size(kind, 12)
    assert _open_png(path) == ("PNG", size) and size[0] > plots.figure_size(kind, 3)[0]


def test_reliability_with_an_unlabeled_class_and_no_labels_at_all(tmp_path, make_predictions):
    frame = make_predictions(sites=("site-a",))
    frame["label__edema"] = np.nan
    path = plots.plot_reliability(frame, ["edema", "atelectasis"], tmp_path / "r.png", title="t")
    assert _open_png(path)[0] == "PNG"
    empty = plots.plot_reliability(frame, ["edema"], tmp_path / "empty.png", title="t")
    assert _open_png(empty) == ("PNG", plots.figure_size("reliability", 0))


@pytest.mark.parametrize("site,expected", [
    ("site-a", "site-a"),
    ("../../etc/passwd", "etc_passwd"),
    ("St. Mary's / ICU #2", "St._Mary_s_ICU_2"),
    ("Hôpital Nord", "H_pital_Nord"),
    ("///", "site"),
])
def test_safe_name(site, expected):
    assert safe_name(site) == expected


def test_figure_names_are_unique_and_short():
    long = "x" * 300
    names = figure_names(["a/b", "a b", "a_b", long, "site-c"])
    assert len(set(names.values())) == 5
    assert names["a/b"] == "a_b" and names["site-c"] == "site-c"
    assert names["a b"].startswith("a_b_") and names["a_b"].startswith("a_b_")
    assert len(names[long]) <= 80


def test_write_report_figures_for_odd_site_names(tmp_path, make_predictions):
    sites = ("../St. Mary's/ICU #2", "a/b", "a b")
    frame = make_predictions(sites=sites, patients_per_site=20)
    info = {"method": "FedAvg", "seed": 0, "classes": ["atelectasis", "edema", "hernia"]}
    report = build_report(frame, info, split="test", n_boot=0, seed=0)
    out = tmp_path / "run"
    out.mkdir()
    paths = write_report(out, report, frame)
    pngs = [p for p in paths if p.suffix == ".png"]
    assert len(pngs) == 2 * len(sites) and len({p.name for p in pngs}) == len(pngs)
    for path in pngs:
        assert path.parent == out and path.is_file()
        assert all(ch.isalnum() or ch in "._-" for ch in path.name)
        assert _open_png(path)[0] == "PNG"
    assert [p for p in tmp_path.rglob("*") if p.is_file() and p.parent != out] == []
    md = (out / "report.md").read_text()
    assert all(f"]({p.name})" in md for p in pngs)
