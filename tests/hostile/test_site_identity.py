"""Site identity (SECURITY.md I14): values that slug alike, non-Latin values and very long values never merge
two hospitals into one site, get the same name in every ingest, and never break an ingest half-way.
"""

from __future__ import annotations

import json
import re

import pandas as pd

from fedcxr.cli import main
from fedcxr.site_adapters.ingest import run_ingest
from fedcxr.site_adapters.site_names import MAX_SITE_NAME, site_names, suffix

MAPPING = {
    "image": {"column": "image", "prefix": "images", "extension": ".png"},
    "patient": "pid",
    "classes": ["edema"],
    "labels": {"edema": "edema"},
    "groups": ["hospital"],
}
LONG = "Hospital of " + "Saint " * 50 + "Mary"  # 312 characters
HOSPITALS = ["Hôpital A", "Hôpital-A", "病院", "医院", "United Kingdom", "CA", LONG]
CLIENT_NAME = re.compile(r"^[A-Za-z0-9-_]+$")  # FLARE's client-name rule (nvflare format_check)


def _rows(hospitals, per_site: int = 6) -> list[dict]:
    return [{"image": f"{i}-{j}", "pid": f"p{i}-{j // 2}", "hospital": h, "edema": str(j % 2)}
            for i, h in enumerate(hospitals) for j in range(per_site)]


def test_values_that_slug_alike_or_are_non_latin_or_long_stay_distinct_sites(csv_export, tmp_path):
    input_dir, mapping = csv_export(_rows(HOSPITALS), MAPPING, size=16)
    report = run_ingest("csv", input_dir, tmp_path / "out", mapping=mapping, site_by="hospital", progress=False,
                        val_fraction=0.0, test_fraction=0.0)
    sites = report["sites"]
    assert len(sites) == len(HOSPITALS) and all(v["rows"] == 6 for v in sites.values()), "no two hospitals merged"
    assert {"CA", "United-Kingdom"} <= set(sites), "values that need no suffix keep their names"
    assert f"H-pital-A-{suffix('Hôpital A')}" in sites and f"H-pital-A-{suffix('Hôpital-A')}" in sites
    assert f"site-{suffix('病院')}" in sites and f"site-{suffix('医院')}" in sites
    assert all(len(s) <= MAX_SITE_NAME and CLIENT_NAME.match(s) for s in sites), "folder and FLARE client names"
    notes = " ".join(report["notes"])
    for value in ("Hôpital A", "Hôpital-A", "病院", "医院"):
        assert value in notes, "every suffixed name is listed beside its value"
    assert f"longer than {MAX_SITE_NAME} characters" in notes
    for site in sites:  # the manifests say which rows are which site, nothing half-written
        frame = pd.read_parquet(tmp_path / "out" / site / "manifest.parquet")
        assert set(frame["site"]) == {site} and len(frame) == 6


def test_a_value_gets_the_same_name_in_every_ingest_whatever_else_it_holds():
    names, _ = site_names(HOSPITALS)
    again, _ = site_names(list(reversed(HOSPITALS)) + ["Hôpital A "])
    assert again["Hôpital A"] == names["Hôpital A"] and again["病院"] == names["病院"] and again[LONG] == names[LONG]
    alone, _ = site_names(["病院"])
    assert alone["病院"] == names["病院"], "a non-Latin value's name does not depend on the other values"


def test_a_long_site_name_option_is_bounded_not_a_traceback(tmp_path, capsys):
    from PIL import Image
    import numpy as np

    folder = tmp_path / "scans"
    folder.mkdir()
    Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16), "L").save(folder / "a.png")
    code = main(["ingest", "images", "--input", str(folder), "--out", str(tmp_path / "out"), "--site-name", LONG,
                 "-q"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "out" / "ingest_report.json").read_text())
    (site,) = report["sites"]
    assert len(site) == MAX_SITE_NAME and site.endswith(suffix(LONG)) and (tmp_path / "out" / site).is_dir()
