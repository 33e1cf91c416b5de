"""Operating points: thresholds chosen on validation rows, metrics with patient-bootstrap CIs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedcxr.evaluation import metrics, operating

# positives 0.9 0.8 0.6 0.3, negatives 0.7 0.5 0.4 0.2 0.1 (M = 4, N = 5)
Y = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0], dtype=float)
P = np.array([0.9, 0.8, 0.6, 0.3, 0.7, 0.5, 0.4, 0.2, 0.1])


def test_thresholds_by_hand():
    """tp(t) = #pos ≥ t and tn(t) = #neg < t at t = 0.1 … 0.9:
    tp 4 4 4 3 3 3 2 2 1, tn 0 1 2 2 3 4 4 5 5, so J = tp/4 + tn/5 − 1 peaks at 0.55 for t = 0.6;
    sensitivity ≥ 0.9 needs tp = 4, highest such t = 0.3; specificity ≥ 0.9 needs tn = 5, lowest t = 0.8."""
    chosen = operating.select_thresholds(Y, P)
    assert list(chosen) == ["youden", "sens90", "spec90"]
    assert chosen["youden"] == (0.6, 0.75, 0.8, None)
    assert chosen["sens90"] == (0.3, 1.0, 0.4, None)
    assert chosen["spec90"] == (0.8, 0.5, 1.0, None)
    three_of_four = operating.sensitivity_threshold(Y, P, target=0.75)
    assert three_of_four.threshold == 0.6 and three_of_four.sensitivity == 0.75
    assert operating.rule_names(0.95, 0.8) == {"youden": "youden", "sensitivity": "sens95", "specificity": "spec80"}
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        operating.select_thresholds(Y, P, target_specificity=1.5)


def test_specificity_one_can_need_a_threshold_above_every_score():
    y = np.array([1, 0, 0, 1], dtype=float)
    p = np.array([0.2, 0.9, 0.3, 0.4])  # the top score is a negative
    t = operating.specificity_threshold(y, p, target=1.0)
    assert t.threshold > 0.9 and t.specificity == 1.0 and t.sensitivity == 0.0
    assert operating.confusion(y, p, t.threshold) == (0, 0, 2, 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rules_are_optimal_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    y = (rng.random(300) < 0.25).astype(float)
    p = np.round(1 / (1 + np.exp(-(rng.normal(size=300) + 1.2 * y))), 2)  # many ties
    y[::13] = np.nan
    keep = ~np.isnan(y)
    yk, pk = y[keep], p[keep]
    grid = np.append(np.unique(pk), 2.0)
    sens = np.array([(pk[yk == 1] >= t).mean() for t in grid])
    spec = np.array([(pk[yk == 0] < t).mean() for t in grid])
    chosen = operating.select_thresholds(y, p, target_sensitivity=0.85, target_specificity=0.8)
    youden = chosen["youden"]
    assert youden.sensitivity + youden.specificity == pytest.approx((sens + spec).max())
    s = chosen["sens85"]
    assert s.sensitivity >= 0.85 and s.specificity == pytest.approx(spec[sens >= 0.85].max())
    q = chosen["spec80"]
    assert q.specificity >= 0.8 and q.sensitivity == pytest.approx(sens[spec >= 0.8].max())
    # what a threshold achieved on its own rows is what applying it there gives
    for t in chosen.values():
        r = operating.rates(operating.confusion(y, p, t.threshold))
        assert (r["sensitivity"], r["specificity"]) == pytest.approx((t.sensitivity, t.specificity))


@pytest.mark.parametrize("y,reason", [([0, 0, 0, np.nan], "no positive rows in val split"),
                                      ([1, 1, np.nan, 1], "no negative rows in val split"),
                                      ([np.nan] * 4, "no labeled rows in val split")])
def test_undefined_thresholds_have_reasons(y, reason):
    for t in operating.select_thresholds(y, [0.1, 0.2, 0.3, 0.4]).values():
        assert np.isnan(t.threshold) and t.reason == reason


def _frame(y, p, site="site-a", patients=None, cls="edema"):
    n = len(y)
    return pd.DataFrame({"site": site, "row_key": [f"r{i}" for i in range(n)],
                         "patient_key": patients if patients is not None else [f"p{i}" for i in range(n)],
                         f"label__{cls}": y, f"prob__{cls}": p})


def test_threshold_dict_has_the_agreed_json_shape():
    val = pd.concat([_frame(Y, P, "site-a"), _frame(np.zeros(9), P, "site b/2")], ignore_index=True)
    val["label__hernia"], val["prob__hernia"] = np.tile(Y, 2), np.tile(P, 2)
    got = operating.operating_point_thresholds(val, ["edema", "hernia", "covid19"])
    assert json.loads(json.dumps(got, allow_nan=False)) == got
    assert got == {
        "site-a": {"edema": {"youden": 0.6, "sens90": 0.3, "spec90": 0.8, "reason": None},
                   "hernia": {"youden": 0.6, "sens90": 0.3, "spec90": 0.8, "reason": None},
                   "covid19": {"youden": None, "sens90": None, "spec90": None,
                               "reason": "no label__covid19 column in val predictions"}},
        "site b/2": {"edema": {"youden": None, "sens90": None, "spec90": None,
                               "reason": "no positive rows in val split"},
                     "hernia": {"youden": 0.6, "sens90": 0.3, "spec90": 0.8, "reason": None},
                     "covid19": {"youden": None, "sens90": None, "spec90": None,
                                 "reason": "no label__covid19 column in val predictions"}}}


def test_confusion_and_rates_by_hand():
    # at 0.6: called positive 0.9 0.8 0.6 (pos) and 0.7 (neg)
    c = operating.confusion(Y, P, 0.6)
    assert c == (3, 1, 4, 1)
    r = operating.rates(c)
    assert r == pytest.approx({"sensitivity": 3 / 4, "specificity": 4 / 5, "ppv": 3 / 4, "npv": 4 / 5})
    nothing_called = operating.rates(operating.confusion(Y, P, 2.0))
    assert np.isnan(nothing_called["ppv"]) and nothing_called["npv"] == pytest.approx(5 / 9)


def _test_and_val(seed=0, n_patients=150):
    rng = np.random.default_rng(seed)

    def draw(n):
        patients = np.repeat([f"P{seed}{i:04d}" for i in range(n)], 2)
        y = (rng.random(2 * n) < 0.3).astype(float)
        y[rng.random(2 * n) < 0.05] = np.nan
        p = 1 / (1 + np.exp(-(rng.normal(size=2 * n) + 2 * np.nan_to_num(y) - 1)))
        return _frame(y, p, patients=patients)

    return draw(n_patients), draw(n_patients)


def test_operating_point_rows_metrics_and_bootstrap_cis():
    test, val = _test_and_val()
    rows = operating.operating_point_rows(test, val, ["edema"], n_boot=300, seed=5)
    assert [r["rule"] for r in rows] == ["youden", "sens90", "spec90"]
    chosen = operating.select_thresholds(val["label__edema"], val["prob__edema"])
    y, p = test["label__edema"].to_numpy(), test["prob__edema"].to_numpy()
    for r in rows:
        t = chosen[r["rule"]]
        assert r["threshold"] == t.threshold and r["val_sensitivity"] == t.sensitivity
        c = operating.confusion(y, p, t.threshold)
        assert (r["tp"], r["fp"], r["tn"], r["fn"]) == c and r["n"] == sum(c) and r["n_pos"] == c.tp + c.fn
        for m, value in operating.rates(c).items():
            assert r[m] == pytest.approx(value)
            assert r[f"{m}_ci_low"] <= value <= r[f"{m}_ci_high"]
        assert r["reason"] is None
    # sens90 is chosen to be sensitive, spec90 to be specific; on new rows too
    by_rule = {r["rule"]: r for r in rows}
    assert by_rule["sens90"]["sensitivity"] > by_rule["spec90"]["sensitivity"]
    assert by_rule["spec90"]["specificity"] > by_rule["sens90"]["specificity"]
    # the CI is the percentile interval of the metric over the patient-level resamples
    t = chosen["youden"].threshold
    called, labeled = p >= t, ~np.isnan(y)
    sens = [w @ (called & (y == 1)) / (w @ (labeled & (y == 1)))
            for chunk in metrics.resample_weights(test["patient_key"].to_numpy(dtype=object), 300, 5) for w in chunk]
    ci = metrics.percentile_ci(sens)
    assert (by_rule["youden"]["sensitivity_ci_low"], by_rule["youden"]["sensitivity_ci_high"]) == pytest.approx(
        (ci.low, ci.high))
    assert operating.operating_point_rows(test, val, ["edema"], n_boot=300, seed=5) == rows


def test_operating_point_rows_undefined_cases_never_crash():
    test, val = _test_and_val(seed=1)
    val_no_pos = val.assign(label__edema=0.0)
    rows = operating.operating_point_rows(test, val_no_pos, ["edema"], n_boot=50, seed=0)
    assert all(np.isnan(r["threshold"]) and r["reason"] == "no positive rows in val split" for r in rows)
    assert all(np.isnan(r["sensitivity"]) and np.isnan(r["ppv_ci_low"]) for r in rows)
    rows = operating.operating_point_rows(test, None, ["edema"], n_boot=50, seed=0)
    assert {r["reason"] for r in rows} == {"no val predictions for this site"}
    # no positives on the evaluated split: sensitivity and PPV undefined, specificity and NPV are not
    test_no_pos = test.assign(label__edema=test["label__edema"].where(test["label__edema"].isna(), 0.0))
    youden = operating.operating_point_rows(test_no_pos, val, ["edema"], n_boot=50, seed=0)[0]
    assert np.isnan(youden["sensitivity"]) and np.isfinite(youden["specificity"])
    assert youden["reason"].startswith("sensitivity undefined: no positive rows in test split")
    assert youden["specificity_ci_low"] <= youden["specificity"] <= youden["specificity_ci_high"]
    # without the bootstrap: point estimates, no CIs
    plain = operating.operating_point_rows(test, val, ["edema"], n_boot=0, seed=0)
    assert np.isfinite(plain[0]["sensitivity"]) and np.isnan(plain[0]["sensitivity_ci_low"])
