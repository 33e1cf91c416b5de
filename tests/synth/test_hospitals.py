"""Hospital registry: stable names, per-image determinism, detector shapes, distinct looks."""

from __future__ import annotations

import numpy as np
import pytest

from fedcxr.errors import UserError
from fedcxr.synth.hospitals import HOSPITALS, cohort, pixels, select, to_uint
from fedcxr.vocab import CLASSES


def test_names_sources_and_class_sets_are_stable():
    assert [h.name for h in select(None)] == ["nih_style", "chexpert_style", "midrc_style", "dicom_style"]
    assert {h.source for h in HOSPITALS.values()} == {"nih", "chexpert", "midrc", "dicom"}
    assert len({h.stream for h in HOSPITALS.values()}) == 4
    for h in HOSPITALS.values():
        assert list(h.classes) == [c for c in CLASSES if c in h.classes]
    assert len(HOSPITALS["nih_style"].classes) == 15 and len(HOSPITALS["chexpert_style"].classes) == 14
    assert [h.name for h in select(["dicom_style", "nih_style", "dicom_style"])] == ["dicom_style", "nih_style"]
    with pytest.raises(UserError, match="unknown synthetic hospital"):
        select(["nope"])


def test_an_image_depends_only_on_seed_hospital_and_index():
    h = HOSPITALS["chexpert_style"]
    short, long = cohort(h, 10, seed=5), cohort(h, 30, seed=5)
    assert short == long[:10]
    assert np.array_equal(pixels(h, short[7], 32, 5), pixels(h, long[7], 32, 5))
    assert not np.array_equal(pixels(h, short[7], 32, 5), pixels(h, cohort(h, 10, seed=6)[7], 32, 5))


def test_detector_shapes_follow_the_hospital():
    shapes = {name: {pixels(h, d, 64, 0).shape for d in cohort(h, 40, 0)} for name, h in HOSPITALS.items()}
    assert shapes["nih_style"] == {(64, 64), (96, 96)}
    assert all(hh > ww for hh, ww in shapes["chexpert_style"])  # portrait, as CheXpert-small
    assert shapes["midrc_style"] == {(96, 80), (80, 96)}
    assert (64, 64) in shapes["dicom_style"] and len(shapes["dicom_style"]) == 2


def test_hospitals_look_different():
    """Per-site intensity statistics differ (what domain adaptation has to bridge)."""
    stats = {}
    for name, h in HOSPITALS.items():
        imgs = [pixels(h, d, 32, 0) for d in cohort(h, 30, 0)]
        stats[name] = (np.mean([i.mean() for i in imgs]), np.mean([np.abs(np.diff(i, axis=1)).mean() for i in imgs]))
    means = sorted(m for m, _ in stats.values())
    assert means[-1] - means[0] > 0.05
    assert stats["dicom_style"][1] > 1.3 * stats["midrc_style"][1]  # noisy CR vs clean DR


def test_to_uint_uses_the_full_range():
    x = np.array([0.0, 0.5, 1.0, 1.2, -0.1])
    assert to_uint(x, 8).tolist() == [0, 128, 255, 255, 0] and to_uint(x, 8).dtype == np.uint8
    assert to_uint(x, 12).max() == 4095 and to_uint(x, 12).dtype == np.uint16
