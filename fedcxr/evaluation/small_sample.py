"""Small samples: when a reported number rests on too few cases, and the intervals that stay honest there.

Why this module exists: a patient-level bootstrap cannot make an interval from one patient (every
resample is that patient), and with a handful of positives it collapses: two positives that both
outscore every negative give AUROC 1 in every resample, so the report printed
``1.000 (1.000–1.000)``, which a reader takes for certainty. DeLong's variance is undefined below
two positives and is 0 at perfect separation, so it collapses the same way.

The rule, for every AUROC fedcxr reports (per class, subgroups, the mean, comparison tables,
FLARE cross-site summaries):

* **Cases are counted in patients**, the independent units: ``pos_patients`` patients with a
  positive labeled image, ``neg_patients`` with a negative one (images when there are no patient
  keys; a patient with both counts on both sides). With one image per patient these are the
  numbers of positive and negative images.
* An AUROC with fewer than :data:`MIN_CASES` (10) positive or 10 negative cases is
  **small-sample** (``small_sample: true``) and is marked in words: "too few cases: 2 positive,
  4 negative".
* Its interval is **Newcombe's score interval** (:func:`newcombe_interval`; Newcombe 2006, Part 2,
  Method 5) computed with the case counts. Newcombe compared asymptotic intervals for the
  Mann–Whitney θ (= AUROC) and found the Hanley–McNeil Wald interval (and with it the DeLong one)
  unreliable for small samples and θ near 1; the score-type interval with his modified variance
  keeps coverage near nominal there, stays inside [0, 1], and has width > 0 even when the
  estimate is 0 or 1. Counting patients rather than images is conservative when a patient has
  several correlated images (the effective sample lies between the two).
* A bootstrap or DeLong interval of a class that is not small-sample but has **no width** (perfect
  separation) is replaced by the same score interval, and the report says so.
* Labeled rows from **one patient**: no interval at all (``null``) and :data:`ONE_PATIENT`.
* The **mean over classes** keeps the patient bootstrap when every class behind it used it.
  Otherwise the bootstrapped classes keep the bootstrap interval of their own mean, and it is
  combined with the other classes' intervals as a class-weighted mean of bounds
  (:func:`mean_of_bounds`; with no bootstrapped class, simply the mean of the classes' bounds).
  The report says how many classes behind the mean are small-sample.
* **Proportions** (sensitivity, specificity, PPV, NPV, accuracy) whose denominator holds fewer
  than 10 cases, or whose bootstrap interval has no width, get the **Wilson score interval**
  (:func:`wilson_interval`; Wilson 1927, recommended for small n by Brown, Cai & DasGupta 2001).

References: R. G. Newcombe, "Confidence intervals for an effect size measure based on the
Mann–Whitney statistic. Part 2: Asymptotic methods and evaluation", Statistics in Medicine
25:559–573 (2006); E. B. Wilson, JASA 22:209–212 (1927); L. D. Brown, T. T. Cai, A. DasGupta,
"Interval estimation for a binomial proportion", Statistical Science 16:101–133 (2001).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import pandas as pd

#: fewer positive or fewer negative cases than this make an AUROC (or a proportion) small-sample
MIN_CASES = 10

# the interval methods a report names (``ci_method``)
BOOTSTRAP = "patient bootstrap"
DELONG = "DeLong"
NEWCOMBE = "Newcombe score"
WILSON = "Wilson score"
MEAN_OF_BOUNDS = "mean of the class intervals"
MEAN_COMBINED = "bootstrap combined with class intervals"
CI_METHODS = (BOOTSTRAP, DELONG, NEWCOMBE, WILSON, MEAN_OF_BOUNDS, MEAN_COMBINED)

#: the reason of a missing interval when every labeled row is one patient's
ONE_PATIENT = "one patient: no interval (an interval needs several independent patients)"
#: the reason of a missing interval of the mean when a class behind it has none
MEAN_WITHOUT_INTERVAL = "no interval of the mean: a class behind it has none"


def collapsed(method: str, replacement: str) -> str:
    """The note of an interval replaced because it had no width (``method`` → ``replacement``)."""
    return f"{method} interval collapsed: {replacement} interval instead"


#: the rule in one paragraph, for reports and their readers
RULE = (f"An AUROC from fewer than {MIN_CASES} positive or {MIN_CASES} negative cases (patients) is marked "
        "'too few cases' (small_sample); its 95% interval is Newcombe's score interval (Stat Med 2006, "
        "Method 5), never a bootstrap over a handful of patients, and a bootstrap interval without width "
        "is replaced by it; one patient gets no interval. The mean's interval then combines the bootstrap "
        "of the other classes' mean with these intervals (conservatively). Sensitivity, specificity, PPV, "
        f"NPV and accuracy from fewer than {MIN_CASES} cases get the Wilson score interval.")


def rule_info() -> dict[str, Any]:
    """The rule as it goes into ``report.json`` (``ci.small_sample``) and ``comparison.json``."""
    return {"min_cases": MIN_CASES,
            "cases": "patients with a positive (negative) labeled image; images without patient keys",
            "auroc_interval": f"{NEWCOMBE}: Newcombe (2006, Stat Med 25:559-573), Method 5",
            "proportion_interval": f"{WILSON}: Wilson (1927)",
            "mean_interval": (f"{MEAN_COMBINED} (or the {MEAN_OF_BOUNDS} when none is bootstrapped) when a "
                              "class behind the mean is not bootstrapped"),
            "rule": RULE}


class Cases(NamedTuple):
    """Labeled images and patients of one class: what an interval can rest on."""

    pos: int
    neg: int
    pos_patients: int
    neg_patients: int
    patients: int

    @property
    def small(self) -> bool:
        return is_small(self.pos_patients, self.neg_patients)


def is_small(pos_cases: int, neg_cases: int) -> bool:
    """Fewer than :data:`MIN_CASES` positive or negative cases."""
    return min(int(pos_cases), int(neg_cases)) < MIN_CASES


def count_cases(y, groups=None) -> Cases:
    """:class:`Cases` of labels ``y`` (1, 0, NaN = unlabeled) with patient keys ``groups`` (or none)."""
    y = np.asarray(y, dtype=float)
    labeled = ~np.isnan(y)
    pos, neg = labeled & (y == 1), labeled & (y == 0)
    if groups is None:
        return Cases(int(pos.sum()), int(neg.sum()), int(pos.sum()), int(neg.sum()), int(labeled.sum()))
    keys = pd.Series(np.asarray(groups, dtype=object))
    return Cases(int(pos.sum()), int(neg.sum()), int(keys[pos].nunique(dropna=False)),
                 int(keys[neg].nunique(dropna=False)), int(keys[labeled].nunique(dropna=False)))


def _count(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def too_few_words(pos: int, neg: int, pos_patients: Optional[int] = None,
                  neg_patients: Optional[int] = None) -> str:
    """"too few cases: 2 positive, 4 negative"; where patients have several images, "too few cases:
    3 positive images of 2 patients, 9 negative images of 6 patients"."""
    if pos_patients is None or neg_patients is None or (pos_patients, neg_patients) == (pos, neg):
        return f"too few cases: {pos} positive, {neg} negative"
    return (f"too few cases: {_count(pos, 'positive image')} of {_count(pos_patients, 'patient')}, "
            f"{_count(neg, 'negative image')} of {_count(neg_patients, 'patient')}")


def row_words(row: Mapping[str, Any]) -> str:
    """:func:`too_few_words` of a ``per_class`` row (``n``, ``n_pos`` and, from schema 3, patient counts)."""
    n_pos, n = int(row["n_pos"]), int(row["n"])
    return too_few_words(n_pos, n - n_pos, row.get("pos_patients"), row.get("neg_patients"))


# --------------------------------------------------------------------------- intervals


def newcombe_interval(auc: float, m: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Newcombe's (2006) Method 5 score interval of an AUROC ``auc`` from ``m`` positive and ``n`` negative cases.

    The set of θ with (θ̂ − θ)² ≤ z² V(θ), where V is the Hanley–McNeil variance with both sample
    sizes replaced by N* = (m + n)/2 − 1 (Newcombe's modification)::

        V(θ) = θ(1 − θ) [1 + N* ((1 − θ)/(2 − θ) + θ/(1 + θ))] / (m n)

    V(θ) → 0 at θ = 0 and 1 but the squared distance does not shrink as fast, so the interval
    stays in [0, 1] and has width > 0 for any estimate, 0 and 1 included. (NaN, NaN) without a
    case on either side or an undefined estimate.
    """
    if not (np.isfinite(auc) and m >= 1 and n >= 1):
        return float("nan"), float("nan")
    from scipy import stats  # SciPy (~1 s) imported where used: every round line imports this module

    z2 = float(stats.norm.ppf(1 - alpha / 2)) ** 2
    n_star = (m + n) / 2.0 - 1.0

    def outside(theta: float) -> float:  # > 0 outside the interval, ≤ 0 inside
        variance = theta * (1 - theta) * (1 + n_star * ((1 - theta) / (2 - theta) + theta / (1 + theta))) / (m * n)
        return (auc - theta) ** 2 - z2 * variance

    return _edge(outside, float(auc), 0.0), _edge(outside, float(auc), 1.0)


def _edge(outside, start: float, end: float) -> float:
    """Where ``outside`` first turns positive going from ``start`` (inside) towards ``end``; ``end``
    if it never does. A grid dense near ``start`` brackets the crossing; ``brentq`` finds it."""
    if start == end:
        return end
    steps = start + (end - start) * np.concatenate([np.geomspace(1e-12, 1.0, 600)])
    values = np.array([outside(t) for t in steps])
    crossing = np.flatnonzero(values > 0)
    if crossing.size == 0:
        return end
    i = int(crossing[0])
    inner = start if i == 0 else float(steps[i - 1])
    from scipy import optimize

    return float(optimize.brentq(outside, inner, float(steps[i]), xtol=1e-12))


def wilson_interval(p_hat: float, n: float, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson's score interval of a proportion ``p_hat`` observed on ``n`` cases (NaN without cases).

    The θ with (p̂ − θ)² ≤ z² θ(1 − θ)/n in closed form; equals ``scipy.stats.binomtest(k, n)
    .proportion_ci(method="wilson")`` for whole k = p̂ n, and takes a case count below the number
    of images (patients) where images are clustered.
    """
    if not (np.isfinite(p_hat) and n >= 1):
        return float("nan"), float("nan")
    from scipy import stats

    z = float(stats.norm.ppf(1 - alpha / 2))
    denom = 1 + z * z / n
    center = (p_hat + z * z / (2 * n)) / denom
    half = z * np.sqrt(p_hat * (1 - p_hat) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if p_hat <= 0 else max(0.0, center - half)  # exactly 0 (not 5e-17) at p̂ = 0, 1 at p̂ = 1
    high = 1.0 if p_hat >= 1 else min(1.0, center + half)
    return float(low), float(high)


def mean_of_bounds(lows: Sequence[float], highs: Sequence[float],
                   weights: Optional[Sequence[float]] = None) -> tuple[float, float]:
    """The interval of a mean over parts as the (``weights``-weighted) mean of the parts' bounds (NaN if
    a bound is missing).

    Why it is safe: SD(Σ w_i X_i) ≤ Σ w_i SD(X_i) (Cauchy–Schwarz; equality when the parts' errors
    are perfectly correlated), so averaging the bounds gives the interval under the least
    favourable correlation between the parts — conservative, and valid wherever each part's own
    interval is. A part may be a block of classes whose mean has its own (bootstrap) interval,
    weighted by its number of classes.
    """
    lows, highs = np.asarray(lows, dtype=float), np.asarray(highs, dtype=float)
    if lows.size == 0 or not (np.isfinite(lows).all() and np.isfinite(highs).all()):
        return float("nan"), float("nan")
    w = np.ones(lows.size) if weights is None else np.asarray(weights, dtype=float)
    return float(lows @ w / w.sum()), float(highs @ w / w.sum())


class Interval(NamedTuple):
    """A chosen interval: bounds (NaN when none), the method that made it, and a note (or None)."""

    low: float
    high: float
    method: Optional[str]
    note: Optional[str]


NO_INTERVAL = Interval(float("nan"), float("nan"), None, None)


def has_width(low: float, high: float) -> bool:
    return bool(np.isfinite(low) and np.isfinite(high) and high - low > 1e-12)


def auroc_interval(auc: float, cases: Cases, default: Interval, alpha: float = 0.05) -> Interval:
    """The interval a class's AUROC gets under the module's rule.

    ``default``: the bootstrap or DeLong interval computed for it (its ``note``, e.g. bootstrap
    resamples lost, is kept when it is used). One patient: none; small-sample: Newcombe's score
    interval; a default without width (or undefined) for a class that is not small-sample: the
    score interval with a note saying so.
    """
    if cases.patients <= 1:
        return Interval(float("nan"), float("nan"), None, ONE_PATIENT)
    if not cases.small and has_width(default.low, default.high):
        return default
    low, high = newcombe_interval(auc, cases.pos_patients, cases.neg_patients, alpha)
    note = None if cases.small or default.method is None else collapsed(default.method, NEWCOMBE)
    return Interval(low, high, NEWCOMBE, note)


def proportion_interval(value: float, cases: int, patients: int, default: Interval,
                        alpha: float = 0.05) -> Interval:
    """The interval of a proportion (sensitivity, accuracy, …) with ``cases`` in its denominator.

    ``default``: the bootstrap interval (``method`` None when there is no bootstrap: then no
    interval, as without the rule). ``patients``: all patients behind the rows (one: none).
    """
    if default.method is None or not np.isfinite(value):
        return default
    if patients <= 1:
        return Interval(float("nan"), float("nan"), None, ONE_PATIENT)
    if cases >= MIN_CASES and has_width(default.low, default.high):
        return default
    low, high = wilson_interval(value, cases, alpha)
    return Interval(low, high, WILSON, None if cases < MIN_CASES else collapsed(default.method, WILSON))


def fill_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``per_class`` row of a report written before schema 3 with the schema-3 fields: ``small_sample``
    from its image counts (the only ones it has), ``ci_method`` and patient counts unknown (None)."""
    out = dict(row)
    if "small_sample" not in out:
        n, n_pos = out.get("n"), out.get("n_pos")
        out["small_sample"] = (bool(is_small(n_pos, n - n_pos)) if isinstance(n, (int, np.integer))
                               and isinstance(n_pos, (int, np.integer)) and n > 0 else False)
    for key in ("ci_method", "pos_patients", "neg_patients"):
        out.setdefault(key, None)
    return out


__all__ = ["BOOTSTRAP", "CI_METHODS", "Cases", "DELONG", "Interval", "MEAN_COMBINED", "MEAN_OF_BOUNDS", "MEAN_WITHOUT_INTERVAL",
           "MIN_CASES", "NEWCOMBE", "NO_INTERVAL", "ONE_PATIENT", "RULE", "WILSON", "auroc_interval", "collapsed",
           "count_cases", "fill_row", "has_width", "is_small", "mean_of_bounds", "newcombe_interval",
           "proportion_interval", "row_words", "rule_info", "too_few_words", "wilson_interval"]
