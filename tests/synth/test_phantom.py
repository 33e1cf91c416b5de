"""Phantom images: shape/range/determinism, one visible signature per finding, learnability."""

from __future__ import annotations

import numpy as np
import pytest

from fedcxr.synth.cohort import CohortProfile, sample_cohort
from fedcxr.synth.phantom import (
    DERIVED,
    NOT_DRAWN,
    RENDERED,
    SiteStyle,
    Subject,
    derived_labels,
    render,
    truth,
)
from fedcxr.vocab import CLASSES

PLAIN = SiteStyle(noise=0.0, blur=0.0, max_rotation=0.0, max_shift=0.0, zoom=(1.0, 1.0))


def mean_image(findings=(), n=24, view="PA", shape=(64, 64), style=PLAIN, **subject) -> np.ndarray:
    """Average of ``n`` renders (different patients) showing ``findings``."""
    s = Subject(view=view, findings=frozenset(findings), **subject)
    return np.mean([render(s, shape, style, np.random.default_rng(i)) for i in range(n)], axis=0)


def test_render_shape_range_dtype_for_square_and_non_square_detectors():
    for shape in [(64, 64), (80, 64), (64, 96), (32, 32)]:
        img = render(Subject(findings=frozenset({"cardiomegaly", "nodule"})), shape, SiteStyle(),
                     np.random.default_rng(0))
        assert img.shape == shape and img.dtype == np.float32
        assert 0.0 <= img.min() and img.max() <= 1.0 and img.std() > 0.05


def test_render_is_deterministic_for_a_seed_and_varies_across_seeds():
    s = Subject(sex="F", age=70, view="AP", findings=frozenset({"pleural_effusion", "support_devices"}))
    a = render(s, (64, 64), SiteStyle(), np.random.default_rng(7))
    b = render(s, (64, 64), SiteStyle(), np.random.default_rng(7))
    c = render(s, (64, 64), SiteStyle(), np.random.default_rng(8))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_every_canonical_class_is_drawn_or_derived():
    derived = set(DERIVED) | {"no_finding"}
    assert set(CLASSES) == RENDERED | derived | NOT_DRAWN
    assert not RENDERED & derived and not (RENDERED | derived) & NOT_DRAWN
    assert set(truth([])) == set(CLASSES) - NOT_DRAWN


def test_unknown_or_derived_findings_cannot_be_drawn():
    with pytest.raises(ValueError, match="lung_opacity"):
        render(Subject(findings=frozenset({"lung_opacity"})))
    with pytest.raises(ValueError, match="view"):
        render(Subject(view="OBLIQUE"))


def test_derived_labels_follow_the_chexpert_hierarchy():
    assert derived_labels([]) == {"lung_lesion": 0, "lung_opacity": 0, "no_finding": 1}
    assert derived_labels(["nodule"])["lung_lesion"] == 1
    assert derived_labels(["consolidation"])["lung_opacity"] == 1
    # devices are not a disease: CheXpert keeps No Finding = 1 with support devices
    assert derived_labels(["support_devices"])["no_finding"] == 1
    assert derived_labels(["fracture"])["no_finding"] == 0


def region(img, rows, cols):
    h, w = img.shape
    return float(img[int(rows[0] * h):int(rows[1] * h), int(cols[0] * w):int(cols[1] * w)].mean())


def test_cardiomegaly_brightens_the_heart_border_and_ap_magnifies_the_heart():
    base, big = mean_image(), mean_image(["cardiomegaly"])
    heart_border = ((0.55, 0.75), (0.64, 0.72))  # left lung base beside the heart (image right)
    assert region(big, *heart_border) > region(base, *heart_border) + 0.1
    ap = mean_image(view="AP")
    assert region(ap, *heart_border) > region(base, *heart_border) + 0.02


def test_effusion_fills_a_lung_base_and_leaves_the_apices():
    base, eff = mean_image(), mean_image(["pleural_effusion"])
    bases = ((0.60, 0.75), (0.10, 0.90))
    apices = ((0.25, 0.35), (0.10, 0.90))
    assert region(eff, *bases) > region(base, *bases) + 0.04
    assert abs(region(eff, *apices) - region(base, *apices)) < 0.01


def test_pneumothorax_darkens_an_apex():
    base, ptx = mean_image(), mean_image(["pneumothorax"])
    apices = ((0.25, 0.4), (0.10, 0.90))
    assert region(ptx, *apices) < region(base, *apices) - 0.015


def test_support_devices_add_very_bright_thin_structures():
    s = Subject(findings=frozenset({"support_devices"}))
    plain = Subject()
    bright = np.mean([(render(s, (64, 64), PLAIN, np.random.default_rng(i)) > 0.85).mean() for i in range(12)])
    none = np.mean([(render(plain, (64, 64), PLAIN, np.random.default_rng(i)) > 0.85).mean() for i in range(12)])
    assert bright > 0.003 and none < bright / 5


@pytest.mark.parametrize("finding", sorted(RENDERED))
def test_each_finding_changes_the_average_image(finding):
    diff = np.abs(mean_image([finding], n=12) - mean_image(n=12))
    assert diff.max() > 0.05, f"{finding} leaves no visible mark"


def test_site_style_changes_the_look_not_the_patient():
    s = Subject(findings=frozenset({"cardiomegaly"}))
    sharp = render(s, (64, 64), SiteStyle(noise=0.0, blur=0.0), np.random.default_rng(1))
    noisy = render(s, (64, 64), SiteStyle(noise=0.05, blur=0.0), np.random.default_rng(1))
    blurred = render(s, (64, 64), SiteStyle(noise=0.0, blur=1.5), np.random.default_rng(1))
    hf = lambda im: float(np.abs(np.diff(im, axis=1)).mean())  # noqa: E731
    assert hf(noisy) > 1.5 * hf(sharp) > 1.5 * hf(blurred)
    assert np.corrcoef(sharp.ravel(), blurred.ravel())[0, 1] > 0.95


def test_findings_are_learnable_from_downsampled_pixels():
    """A linear model on 32-px pixels separates the common findings (AUROC > 0.7)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    draws = sample_cohort(450, CohortProfile(covid_prevalence=0.3), np.random.default_rng(1))
    style = SiteStyle()
    x = np.stack([render(d.subject, (32, 32), style, np.random.default_rng(d.index)).ravel() for d in draws])
    train = np.arange(len(draws)) < 300
    aurocs = {}
    for cls in ["cardiomegaly", "pleural_effusion", "edema", "covid19", "no_finding"]:
        y = np.array([truth(d.subject.findings)[cls] for d in draws])
        model = LogisticRegression(C=0.05, max_iter=300).fit(x[train], y[train])
        aurocs[cls] = roc_auc_score(y[~train], model.decision_function(x[~train]))
    assert all(v > 0.7 for v in aurocs.values()), aurocs
