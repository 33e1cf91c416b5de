"""What a site's evaluation summary may hold before the server reports it (FLARE cross-site evaluation).

In a federation the ``sites`` entry of a report comes from another hospital's reply
(:mod:`fedcxr.flare.site_evaluation`); a faulty or hostile site could send an AUROC of 42, a
count of -7, or a "reason" holding ``=HYPERLINK(...)``, raw HTML or a Markdown heading that the
server's ``per_class.csv`` and ``report.md`` would carry to every reader. :func:`summary_problem`
accepts a summary only when it has exactly the shape :func:`fedcxr.evaluation.report.evaluate_rows`
(+ subgroups + calibration) produces:

* every key is a known field at its place (anything else is refused);
* AUROCs, CIs, prevalences, accuracies, Brier scores, ECEs and bin edges are numbers in [0, 1]
  (or null/NaN where undefined); counts are non-negative integers, positives ≤ labeled rows;
* every text is a class of the run, a subgroup value of fedcxr's vocabularies, one of the
  reason texts fedcxr itself writes (:data:`REASONS`) or one of its interval methods; nothing else;
* the small-sample flag (schema 3, :mod:`fedcxr.evaluation.small_sample`) is true or false and
  agrees with the row's counts (a class with 2 positives cannot be sent as a large sample), and
  patient counts never exceed image counts.

The server escapes every text it writes anyway (:mod:`fedcxr.escape`); this check makes sure
the numbers in a consortium's report are at least possible ones. A site can still lie within
these ranges (SECURITY.md says so). Never imports :mod:`fedcxr.pipeline`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from fedcxr.escape import short
from fedcxr.evaluation import small_sample
from fedcxr.vocab import AUX_VOCAB

#: the reason texts fedcxr's evaluation writes (``{class}`` is a class of the run, ``{split}`` a split)
REASONS = (
    r"no labeled rows in {split} split", r"no positive rows in {split} split", r"no negative rows in {split} split",
    r"no label column label__{class}", r"model has no output prob__{class}",
    r"CI undefined: every bootstrap resample had a single label value",
    r"DeLong CI undefined: fewer than 2 positive or 2 negative rows",
    r"no class has a defined AUROC", r"CI of the mean needs the patient bootstrap \(n_boot > 0\)",
    r"CI undefined: every bootstrap resample lost a class", r"no labeled rows of {class}",
    r"no aux__(?:sex|age_bin|race) column in predictions", r"value not recorded \(null\)", r"fewer than \d{1,6} rows",
    r"no label__{class} or prob__{class} column",
    # schema 3: the small-sample rule (fedcxr.evaluation.small_sample)
    re.escape(small_sample.ONE_PATIENT), re.escape(small_sample.MEAN_WITHOUT_INTERVAL),
    "(?:" + "|".join(re.escape(small_sample.collapsed(m, r)) for m in (small_sample.BOOTSTRAP, small_sample.DELONG)
                     for r in (small_sample.NEWCOMBE, small_sample.WILSON)) + ")",
)
SUBGROUP_TASKS = ("sex", "age_bin", "race")
BINNING = "equal-width on [0, 1]"
MAX_COUNT = 10**9
MAX_BINS = 1000

_PROB_ENTRY = ("mean_auroc", "mean_auroc_ci_low", "mean_auroc_ci_high", "accuracy", "accuracy_threshold",
               "accuracy_ci_low", "accuracy_ci_high")
_ENTRY_REQUIRED = ("n_rows", "n_patients", "per_class", "mean_auroc", "mean_auroc_ci_low", "mean_auroc_ci_high",
                   "mean_auroc_classes", "mean_auroc_reason")
_ENTRY_OPTIONAL = ("mean_auroc_ci_skipped", "accuracy", "accuracy_threshold", "accuracy_ci_low", "accuracy_ci_high",
                   "accuracy_reason", "mean_auroc_small_sample_classes", "mean_auroc_ci_method",
                   "accuracy_small_sample", "accuracy_ci_method")
_CLASS_ROW = {"class": "cls", "auroc": "prob", "ci_low": "prob", "ci_high": "prob", "n": "count",
              "n_pos": "count", "prevalence": "prob", "reason": "reason"}
#: schema 3 (optional: a site running an older fedcxr does not send them; the server fills them in)
_CLASS_ROW_OPTIONAL = {"ci_skipped": "count", "small_sample": "flag", "ci_method": "method",
                       "pos_patients": "count", "neg_patients": "count"}
_CAL_ROW = {"class": "cls", "n": "count", "n_pos": "count", "brier": "prob", "ece": "prob", "reason": "reason"}
_BIN = {"low": "prob", "high": "prob", "n": "count", "mean_predicted": "prob", "observed": "prob"}


class _Refused(ValueError):
    """Where and why a summary is refused (the message is bounded: it quotes at most a short repr)."""


def summary_problem(entry: Any, classes: Sequence[str]) -> Optional[str]:
    """Why a site's summary cannot be reported (None when it can): see the module doc."""
    try:
        _Checker(list(classes)).entry(entry, "summary", top=True)
    except _Refused as exc:
        return str(exc)
    return None


class _Checker:
    def __init__(self, classes: list[str]) -> None:
        self.classes = classes
        names = "|".join(re.escape(c) for c in classes) or "(?!)"
        patterns = [p.replace("{class}", f"(?:{names})").replace("{split}", "[a-z]{1,16}") for p in REASONS]
        self.reason_re = re.compile("(?:" + "|".join(patterns) + ")")

    # ------------------------------------------------------------------ shapes
    def entry(self, entry: Any, where: str, *, top: bool) -> None:
        record = self.mapping(entry, where)
        allowed = set(_ENTRY_REQUIRED) | set(_ENTRY_OPTIONAL) | ({"subgroups", "calibration"} if top else set())
        self.keys(record, where, required=_ENTRY_REQUIRED + (("subgroups",) if top else ()), allowed=allowed)
        n_rows = self.count(record["n_rows"], f"{where}.n_rows")
        if self.count(record["n_patients"], f"{where}.n_patients") > n_rows:
            raise _Refused(f"{where}: more patients than images")
        for key in _PROB_ENTRY:
            if key in record:
                self.prob(record[key], f"{where}.{key}")
        if "mean_auroc_ci_skipped" in record:
            self.count(record["mean_auroc_ci_skipped"], f"{where}.mean_auroc_ci_skipped")
        for key in ("mean_auroc_reason", "accuracy_reason"):
            if key in record:
                self.reason(record[key], f"{where}.{key}")
        for key in ("mean_auroc_ci_method", "accuracy_ci_method"):
            if key in record:
                self.method(record[key], f"{where}.{key}")
        if "accuracy_small_sample" in record:
            self.flag(record["accuracy_small_sample"], f"{where}.accuracy_small_sample")
        used = self.sequence(record["mean_auroc_classes"], f"{where}.mean_auroc_classes")
        for i, cls in enumerate(used):
            self.cls(cls, f"{where}.mean_auroc_classes[{i}]")
        small = self.sequence(record.get("mean_auroc_small_sample_classes", []),
                              f"{where}.mean_auroc_small_sample_classes")
        for i, cls in enumerate(small):
            if cls not in used:
                raise _Refused(f"{where}.mean_auroc_small_sample_classes[{i}]: {short(cls)} is not behind the mean")
        rows = self.sequence(record["per_class"], f"{where}.per_class")
        if [r.get("class") if isinstance(r, Mapping) else None for r in rows] != self.classes:
            raise _Refused(f"{where}.per_class: rows are not the run's classes in order")
        for i, row in enumerate(rows):
            self.row(row, f"{where}.per_class[{i}]", _CLASS_ROW, optional=_CLASS_ROW_OPTIONAL)
            self.small_flag(row, f"{where}.per_class[{i}]")
        if top:
            self.subgroups(record["subgroups"], f"{where}.subgroups")
            if "calibration" in record:
                self.calibration(record["calibration"], f"{where}.calibration")

    def subgroups(self, value: Any, where: str) -> None:
        record = self.mapping(value, where)
        self.keys(record, where, required=(), allowed=set(SUBGROUP_TASKS))
        for task, sub in record.items():
            sub = self.mapping(sub, f"{where}.{task}")
            self.keys(sub, f"{where}.{task}", required=("groups", "skipped"), allowed={"groups", "skipped"})
            groups = self.mapping(sub["groups"], f"{where}.{task}.groups")
            for name, group in groups.items():
                self.group_name(task, name, f"{where}.{task}.groups")
                self.entry(group, f"{where}.{task}.groups.{name}", top=False)
            for i, item in enumerate(self.sequence(sub["skipped"], f"{where}.{task}.skipped")):
                at = f"{where}.{task}.skipped[{i}]"
                item = self.mapping(item, at)
                self.keys(item, at, required=("value", "n_rows", "reason"), allowed={"value", "n_rows", "reason"})
                if item["value"] not in (None, "unknown"):
                    self.group_name(task, item["value"], f"{at}.value")
                self.count(item["n_rows"], f"{at}.n_rows")
                self.reason(item["reason"], f"{at}.reason")

    def calibration(self, value: Any, where: str) -> None:
        record = self.mapping(value, where)
        fields = ("n_bins", "binning", "per_class", "mean_brier", "mean_ece", "pooled")
        self.keys(record, where, required=fields, allowed=set(fields))
        n_bins = self.count(record["n_bins"], f"{where}.n_bins")
        if not 1 <= n_bins <= MAX_BINS:
            raise _Refused(f"{where}.n_bins: {short(n_bins)} bins (1 to {MAX_BINS})")
        if record["binning"] != BINNING:
            raise _Refused(f"{where}.binning: unknown binning {short(record['binning'])}")
        self.prob(record["mean_brier"], f"{where}.mean_brier")
        self.prob(record["mean_ece"], f"{where}.mean_ece")
        rows = self.sequence(record["per_class"], f"{where}.per_class")
        if [r.get("class") if isinstance(r, Mapping) else None for r in rows] != self.classes:
            raise _Refused(f"{where}.per_class: rows are not the run's classes in order")
        for i, row in enumerate(rows):
            self.row(row, f"{where}.per_class[{i}]", _CAL_ROW)
        pooled = self.mapping(record["pooled"], f"{where}.pooled")
        self.keys(pooled, f"{where}.pooled", required=("n", "brier", "ece", "bins"), allowed={"n", "brier", "ece", "bins"})
        self.count(pooled["n"], f"{where}.pooled.n")
        self.prob(pooled["brier"], f"{where}.pooled.brier")
        self.prob(pooled["ece"], f"{where}.pooled.ece")
        bins = self.sequence(pooled["bins"], f"{where}.pooled.bins")
        if len(bins) != n_bins:
            raise _Refused(f"{where}.pooled.bins: {len(bins)} bins, n_bins says {n_bins}")
        for i, item in enumerate(bins):
            self.row(item, f"{where}.pooled.bins[{i}]", _BIN)

    def row(self, value: Any, where: str, spec: dict, optional: Optional[dict] = None) -> None:
        record = self.mapping(value, where)
        optional = optional or {}
        self.keys(record, where, required=tuple(spec), allowed=set(spec) | set(optional))
        for key, kind in {**spec, **optional}.items():
            if key in record:
                getattr(self, kind)(record[key], f"{where}.{key}")
        if "n_pos" in record and record["n_pos"] > record["n"]:
            raise _Refused(f"{where}: more positives ({short(record['n_pos'])}) than labeled rows ({short(record['n'])})")

    def small_flag(self, row: Mapping, where: str) -> None:
        """The flag and patient counts must agree with the row's own counts: a site cannot call 2
        positives a large sample (cases in patients are never more than images)."""
        n_pos, n_neg = row["n_pos"], row["n"] - row["n_pos"]
        for key, images in (("pos_patients", n_pos), ("neg_patients", n_neg)):
            if key in row and row[key] > images:
                raise _Refused(f"{where}.{key}: {short(row[key])} patients but {images} images")
        if row.get("small_sample") is False and small_sample.is_small(n_pos, n_neg):
            raise _Refused(f"{where}.small_sample: false with {n_pos} positive and {n_neg} negative images "
                           f"(fewer than {small_sample.MIN_CASES} is small-sample)")

    # ------------------------------------------------------------------ values
    def mapping(self, value: Any, where: str) -> Mapping:
        if not isinstance(value, Mapping):
            raise _Refused(f"{where}: expected a mapping, got {type(value).__name__}")
        return value

    def sequence(self, value: Any, where: str) -> list:
        if not isinstance(value, (list, tuple)):
            raise _Refused(f"{where}: expected a list, got {type(value).__name__}")
        return list(value)

    def keys(self, record: Mapping, where: str, *, required: Sequence[str], allowed: set) -> None:
        unknown = [k for k in record if k not in allowed]
        if unknown:
            raise _Refused(f"{where}: unknown field {short(unknown[0])}")
        missing = [k for k in required if k not in record]
        if missing:
            raise _Refused(f"{where}: lacks {missing}")

    def prob(self, value: Any, where: str) -> None:
        if value is None:
            return
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise _Refused(f"{where}: {short(value)} is not a number")
        if math.isnan(float(value)):
            return
        if not 0.0 <= float(value) <= 1.0:
            raise _Refused(f"{where}: {short(value)} is outside [0, 1]")

    def count(self, value: Any, where: str) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise _Refused(f"{where}: {short(value)} is not a whole number")
        if not 0 <= int(value) <= MAX_COUNT:
            raise _Refused(f"{where}: {short(value)} is not a count (0 to {MAX_COUNT:,})")
        return int(value)

    def flag(self, value: Any, where: str) -> None:
        if not isinstance(value, (bool, np.bool_)):
            raise _Refused(f"{where}: {short(value)} is not true or false")

    def method(self, value: Any, where: str) -> None:
        if value is not None and value not in small_sample.CI_METHODS:
            raise _Refused(f"{where}: {short(value)} is not an interval method fedcxr uses")

    def cls(self, value: Any, where: str) -> None:
        if value not in self.classes:
            raise _Refused(f"{where}: {short(value)} is not a class of this run")

    def reason(self, value: Any, where: str) -> None:
        if value is None:
            return
        if not isinstance(value, str) or not self.reason_re.fullmatch(value):
            raise _Refused(f"{where}: {short(value)} is not a reason fedcxr writes")

    def group_name(self, task: str, name: Any, where: str) -> None:
        known = AUX_VOCAB.get(task, [])
        if not (isinstance(name, str) and (name in known or re.fullmatch(r"code -?\d{1,6}", name))):
            raise _Refused(f"{where}: {short(name)} is not a {task} value")


__all__ = ["REASONS", "summary_problem"]
