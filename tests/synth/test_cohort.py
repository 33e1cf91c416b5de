"""Cohort model: exact counts, determinism, co-occurrence structure, measurable prevalences."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

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


# --------------------------------------------------------------------------- NIH's demographic effects

#: NIH ChestX-ray14's case mix, roughly: 43.5 % women, age 46.6 ± 16.6, 40 % AP films
NIH_LIKE = dict(female_fraction=0.435, age_mean=46.6, age_sd=16.6, ap_bias=-0.45, extra_studies=0.0)


def cells_of(draws) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from fedcxr.vocab import age_bin_code

    sex = np.array([d.patient.sex == "M" for d in draws], dtype=int)
    age = np.array([age_bin_code(d.age) for d in draws], dtype=int)
    view = np.array([d.subject.view == "AP" for d in draws], dtype=int)
    return sex, age, view


@pytest.mark.parametrize("mode, profile", [
    ("nih_prevalence", NIH_LIKE),
    ("nih", dict(prevalence_shift=0.3, ap_bias=0.5, extra_studies=0.0)),
])
def test_prevalence_by_sex_age_and_view_follows_nih(mode, profile):
    """6,000 draws (one study per patient, so images are independent): each NIH finding's prevalence
    by sex, by age bin (bins of 200 draws or more) and by view is within 4 binomial standard errors
    of NIH's fitted model for the drawn patients — ``nih_prevalence`` at NIH's levels, ``nih`` at the
    finding's level and the profile's shift (NIH's odds ratios either way) — despite the latent
    factors and the acute patients' AP films."""
    from scipy.special import expit

    from fedcxr.synth import demographics as nih
    from fedcxr.synth.cohort import FINDINGS

    prof = CohortProfile(demographics=mode, **profile)
    draws = sample_cohort(6000, prof, np.random.default_rng(11))
    sex, age, view = cells_of(draws)
    for finding in nih.nih_findings():
        logits = nih.cell_logits(finding) + prof.prevalence_shift
        if mode == "nih":
            logits = logits + nih.lift(finding, FINDINGS[finding].level)
        expected = expit(logits[sex, age, view])
        has = np.array([finding in d.subject.findings for d in draws])
        for name, codes in (("sex", sex), ("age_bin", age), ("view", view)):
            for value in np.unique(codes):
                chosen = codes == value
                if chosen.sum() < 200:
                    continue
                se = np.sqrt((expected[chosen] * (1 - expected[chosen])).sum()) / chosen.sum()
                gap = has[chosen].mean() - expected[chosen].mean()
                assert abs(gap) < 4 * se, (finding, name, value, has[chosen].mean(), expected[chosen].mean())


def test_nih_like_case_mix_gives_nih_prevalences_by_sex_age_and_view():
    """With NIH's case mix, what the model expects for the drawn patients is NIH's own prevalence by
    sex, by age bin and by view within 1 point (the rest is the mix: view share by age, the age
    curve): so the previous test's 4 standard errors (≈ 1-2 points at 6,000 draws) are NIH's."""
    from scipy.special import expit

    from fedcxr.synth import demographics as nih

    _, mix = nih.tables()
    sex, age, view = cells_of(sample_cohort(6000, CohortProfile(demographics="nih_prevalence", **NIH_LIKE),
                                            np.random.default_rng(11)))
    assert abs(view.mean() - 0.40) < 0.03 and abs(sex.mean() - 0.565) < 0.03
    for finding in nih.nih_findings():
        p = expit(nih.cell_logits(finding))
        for axis, codes in ((0, sex), (1, age), (2, view)):
            for value in np.unique(codes):
                chosen = codes == value
                if chosen.sum() < 200:
                    continue
                nih_value = float((np.take(mix, value, axis) * np.take(p, value, axis)).sum() / np.take(mix, value, axis).sum())
                ours = float(p[sex[chosen], age[chosen], view[chosen]].mean())
                assert abs(ours - nih_value) < 0.01, (finding, axis, value, ours, nih_value)


def test_default_hospitals_take_nih_odds_ratios():
    """The default (``nih``) cohort: edema on AP films and hernia in the old, as in NIH; sex matters."""
    draws = sample_cohort(6000, CohortProfile(extra_studies=0.0), np.random.default_rng(12))
    assert CohortProfile().demographics == "nih"
    has = lambda c: np.array([c in d.subject.findings for d in draws])  # noqa: E731
    sex, age, view = cells_of(draws)
    odds = lambda x: x.mean() / (1 - x.mean())  # noqa: E731
    assert odds(has("edema")[view == 1]) > 4 * odds(has("edema")[view == 0])  # NIH: × 11.7 in the reference cell
    assert has("hernia")[age >= 3].mean() > 4 * has("hernia")[age <= 1].mean()
    assert odds(has("cardiomegaly")[sex == 1]) < 0.8 * odds(has("cardiomegaly")[sex == 0])  # NIH: × 0.69


def test_legacy_reproduces_the_previous_model_draw_for_draw():
    """``legacy``: the findings of the model before NIH's effects (fingerprints taken from it)."""
    import hashlib

    def fingerprint(profile):
        draws = sample_cohort(500, profile, np.random.default_rng(7))
        text = "\n".join(f"{d.patient.index},{d.patient.sex},{d.age:.6f},{d.patient.race},{d.study},{d.view_number},"
                         f"{d.subject.view},{'|'.join(sorted(d.subject.findings))}" for d in draws)
        return hashlib.sha256(text.encode()).hexdigest()

    assert fingerprint(CohortProfile(demographics="legacy")) == (
        "da855380177fe548f517a658bd45271dace36bd0b86855607416b56cbf5e319d")
    busy = CohortProfile(lateral_fraction=0.3, covid_prevalence=0.4, ap_bias=0.5, prevalence_shift=0.3,
                         race_probs={"white": 0.5, "black": 0.5}, demographics="legacy")
    assert fingerprint(busy) == "13f95e9b4cdc09c7d17efbb7f41cc22a99a59c48c01193e81b722189fbdb34fa"


def test_modes_share_patients_studies_and_views():
    runs = {m: sample_cohort(400, CohortProfile(demographics=m, lateral_fraction=0.2), np.random.default_rng(3))
            for m in ("nih", "nih_prevalence", "legacy")}
    who = {m: [(d.patient.sex, d.age, d.study, d.subject.view) for d in draws] for m, draws in runs.items()}
    assert who["nih"] == who["nih_prevalence"] == who["legacy"]
    assert [d.subject.findings for d in runs["nih"]] != [d.subject.findings for d in runs["legacy"]]


def test_unknown_demographics_is_refused():
    with pytest.raises(ValueError, match="demographics 'nhi'"):
        CohortProfile(demographics="nhi")
