"""Ground truth of ingested synthetic images: found again from the recorded path, for every
class, and equal to what each hospital labels wherever it labels."""

from __future__ import annotations

import pandas as pd
import pytest

from fedcxr.errors import UserError
from fedcxr.site_adapters.manifest import read_manifest, read_site_json
from fedcxr.synth import ingest_synthetic, read_synth_json, write_synthetic_export
from fedcxr.synth.phantom import truth
from fedcxr.synth.truth import true_labels


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    root = tmp_path_factory.mktemp("truth")
    write_synthetic_export(root / "export", images_per_site=50, image_size=32, seed=3)
    sites = ingest_synthetic(root / "export", root / "manifests")
    return read_synth_json(root / "export"), sites


def test_every_ingested_image_matches_its_hospitals_labels(ingested):
    spec, sites = ingested
    every_class = {f"truth__{c}" for c in truth(())}
    for name, site_dir in sites.items():
        manifest = read_manifest(site_dir)
        found = true_labels(spec, name, manifest["image_path"])
        assert list(found.index) == list(manifest.index) and set(found.columns) == every_class
        for cls in read_site_json(site_dir)["class_set"]:
            if cls == "no_finding":  # "none of *my* classes": depends on the hospital's label set
                continue
            labeled = manifest[f"label__{cls}"].notna()
            assert (manifest.loc[labeled, f"label__{cls}"].astype(int) == found.loc[labeled, f"truth__{cls}"]).all(), \
                (name, cls)
        # it knows the classes the hospital does not label too (midrc_style labels covid19 only)
        if name == "midrc_style":
            assert found["truth__cardiomegaly"].sum() > 0


def test_a_path_of_another_export_is_an_error_naming_it(ingested):
    spec, _ = ingested
    with pytest.raises(UserError, match="IM999999"):
        true_labels(spec, "dicom_style", pd.Series(["CR_ROOM2/DS1/study1/IM999999.dcm"]))
    with pytest.raises(UserError, match="not in this export"):
        true_labels(spec, "no_such_hospital", pd.Series(["x.png"]))
