"""Cohort model: exact counts, determinism, co-occurrence structure, measurable prevalences."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from fedcxr.synth.cohort import PATIENT_LEVEL, CohortProfile, sample_cohort
from fedcxr.synth.phantom import truth


def prevalences(draws) -> dict[str, float]:
    counts = Counter()
    for d in draws:
        counts.update({k: v for k, v in truth(d.subject.findings).items()})
    return {k: counts[k] / len(draws) for k in counts}


def test_exact_number_of_images_and_deterministic():
    a = sample_cohort(37, CohortProfile(lateral_fraction=0.4), np.random.default_rng(3))
    b = sample_cohort(37, CohortProfile(lateral_fraction=0.4), np.random.default_rng(3))
    assert len(a) == 37 and a == b
    assert [d.index for d in a] == list(range(37))


def test_studies_and_views_are_numbered_within_patients():
    draws = sample_cohort(300, CohortProfile(lateral_fraction=0.5, extra_studies=1.0), np.random.default_rng(0))
    per_patient = defaultdict(list)
    for d in draws:
        per_patient[d.patient.index].append(d)
    assert any(len(v) > 2 for v in per_patient.values())
    for images in per_patient.values():
        studies = [d.study for d in images]
        assert studies == sorted(studies) and studies[0] == 1
        ages = [d.age for d in images]
        assert ages == sorted(ages)
        for study in set(studies):
            views = [d for d in images if d.study == study]
            assert [d.view_number for d in views] == list(range(1, len(views) + 1))
            assert len({d.subject.findings for d in views}) == 1  # labels are per study
            assert all(d.subject.view == "LATERAL" for d in views[1:])


def test_no_laterals_unless_asked_and_no_covid_without_prevalence():
    draws = sample_cohort(400, CohortProfile(), np.random.default_rng(1))
    assert {d.subject.view for d in draws} == {"PA", "AP"}
    assert not any("covid19" in d.subject.findings for d in draws)


def test_patient_level_findings_persist_across_studies():
    draws = sample_cohort(600, CohortProfile(covid_prevalence=0.4, extra_studies=1.5), np.random.default_rng(2))
    per_patient = defaultdict(set)
    for d in draws:
        per_patient[d.patient.index].add(d.subject.findings & PATIENT_LEVEL)
    assert all(len(v) == 1 for v in per_patient.values())
    assert 0.25 < prevalences(draws)["covid19"] < 0.5


def test_common_findings_have_measurable_prevalence():
    p = prevalences(sample_cohort(3000, CohortProfile(), np.random.default_rng(0)))
    for cls in ["atelectasis", "cardiomegaly", "consolidation", "edema", "pleural_effusion", "pneumonia",
                "pneumothorax", "support_devices", "no_finding"]:
        assert 0.08 <= p[cls] <= 0.4, (cls, p[cls])
    assert 0.005 < p["hernia"] < 0.08


def test_findings_co_occur_and_grow_with_age():
    draws = sample_cohort(4000, CohortProfile(), np.random.default_rng(5))
    has = lambda d, c: c in d.subject.findings  # noqa: E731
    cardio = [d for d in draws if has(d, "cardiomegaly")]
    rest = [d for d in draws if not has(d, "cardiomegaly")]
    edema_given = np.mean([has(d, "edema") for d in cardio])
    edema_not = np.mean([has(d, "edema") for d in rest])
    assert edema_given > 2 * edema_not  # the shared cardiac factor
    old = [len(d.subject.findings) for d in draws if d.age >= 70]
    young = [len(d.subject.findings) for d in draws if d.age < 40]
    assert np.mean(old) > np.mean(young) + 0.5
    ap_devices = np.mean([has(d, "support_devices") for d in draws if d.subject.view == "AP"])
    pa_devices = np.mean([has(d, "support_devices") for d in draws if d.subject.view == "PA"])
    assert ap_devices > 1.5 * pa_devices  # sicker patients are imaged AP


def test_prevalence_shift_and_race_mix():
    base = prevalences(sample_cohort(2000, CohortProfile(), np.random.default_rng(4)))
    sick = prevalences(sample_cohort(2000, CohortProfile(prevalence_shift=0.6), np.random.default_rng(4)))
    assert sick["cardiomegaly"] > base["cardiomegaly"] and sick["no_finding"] < base["no_finding"]
    draws = sample_cohort(1000, CohortProfile(race_probs={"white": 0.5, "black": 0.5}, race_missing=0.1),
                          np.random.default_rng(4))
    races = Counter(d.patient.race for d in draws)
    assert set(races) == {"white", "black", None}
    assert sample_cohort(5, CohortProfile(), np.random.default_rng(0))[0].patient.race is None
