"""Derive the synthetic hospitals' demographic effects from NIH ChestX-ray14's real metadata.

Why: for the auxiliary heads of AuxInfo (sex, age bin, view) to share signal with the findings
the way they do in real hospitals, the synthetic findings must depend on sex, age and view as
real ones do. The NIH ChestX-ray14 metadata (``Data_Entry_2017_v2020.csv.gz``: 112,120 images
with ``Finding Labels``, ``Patient Age``, ``Patient Gender``, ``View Position``) is public and
labels the same 14 findings on every image, so its joint prevalences by sex × age bin × view are
the reference.

What is fitted, per NIH finding (mapped onto fedcxr's classes by fedcxr's own NIH adapter,
:func:`fedcxr.site_adapters.nih.read_nih`, so ``Effusion`` is ``pleural_effusion``): a logistic
model of the image-level prevalence over the 2 × 5 × 2 = 20 cells of sex (F/M), age bin
(fedcxr's ``age_bin``: 0-19, 20-39, 40-59, 60-79, 80+) and frontal view (PA/AP)::

    logit P = intercept + sex + age bin + view + sex×view + age×view + sex×age

with F, 40-59, PA as the reference cell (the most populated) — 16 coefficients on 20 cells. All
two-way interactions because the main effects alone miss cells by up to 3.6 percentage points
(pneumothorax; cardiomegaly 2.1, emphysema 2.9) and age×view alone by up to 2.8; with all three
the largest miss in a cell of over 1,000 images is 1.8 points (pneumothorax), most under 0.5.
Fitted with scikit-learn's ``LogisticRegression`` (Newton's method, ``newton-cholesky``, to 1e-12:
two solvers agree to 1e-9, so the committed 4 decimals re-derive exactly) on the aggregated cells (positives and
negatives weighted by their counts — the same likelihood as the 112,120 rows) with a weak ridge,
``C = 10`` (a N(0, 10) prior on each coefficient): it changes nothing where a cell has data and
keeps a coefficient finite where a cell has no positive (hernia under 20 in AP views: 0 of 3,390
images).

Written to ``fedcxr/synth/nih_findings.csv`` (one row per finding: the coefficients, the NIH
positives and prevalence) and ``fedcxr/synth/nih_mix.csv`` (images per cell: NIH's case mix).
Both are committed; the synthetic hospitals read them (:mod:`fedcxr.synth.demographics`) and never
need the NIH data. ``tests/synth/test_nih_fit.py`` re-derives them from ``../shared/data`` when it
is there and checks the committed numbers to their last decimal. To re-derive::

    python -m fedcxr.synth.nih_fit ../shared/data/nih-chestxray14 --out fedcxr/synth
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fedcxr.errors import UserError
from fedcxr.vocab import AUX_VOCAB, aux_column, raw_column

#: the committed tables, beside this module
FINDINGS_CSV = "nih_findings.csv"
MIX_CSV = "nih_mix.csv"
#: decimals kept in the committed coefficients (the re-derivation test compares to this rounding)
DECIMALS = 4
#: the ridge: C of scikit-learn's LogisticRegression (module doc)
RIDGE_C = 10.0

REFERENCE_AGE_BIN = 2  # 40-59
AGE_BINS = tuple(range(len(AUX_VOCAB["age_bin"])))
AGE_NAMES = {0: "age_0_19", 1: "age_20_39", 3: "age_60_79", 4: "age_80p"}
#: coefficient names, in the committed column order (``:`` marks an interaction)
TERMS: tuple[str, ...] = (
    ("intercept", "sex_M")
    + tuple(AGE_NAMES.values())
    + ("view_AP", "sex_M:view_AP")
    + tuple(f"{a}:view_AP" for a in AGE_NAMES.values())
    + tuple(f"sex_M:{a}" for a in AGE_NAMES.values())
)
SEX_CODES = {"F": 0, "M": 1}  # fedcxr.vocab.AUX_VOCAB["sex"] order
VIEW_CODES = {"PA": 0, "AP": 1}


def design(sex: np.ndarray, age_bin: np.ndarray, view: np.ndarray) -> np.ndarray:
    """The model's design matrix (rows × len(TERMS)) for cells given as 0/1 codes (sex M = 1, AP = 1)."""
    sex, age_bin, view = (np.asarray(a, dtype=int) for a in (sex, age_bin, view))
    ages = [(age_bin == b).astype(float) for b in AGE_NAMES]
    cols = [np.ones(len(sex)), sex.astype(float), *ages, view.astype(float), (sex * view).astype(float)]
    cols += [a * view for a in ages] + [a * sex for a in ages]
    return np.column_stack(cols)


def cell_grid() -> pd.DataFrame:
    """The 20 cells in a fixed order: sex (F, M) × age bin × view (PA, AP)."""
    rows = [(s, a, v) for s in (0, 1) for a in AGE_BINS for v in (0, 1)]
    return pd.DataFrame(rows, columns=["sex", "age_bin", "view"])


def nih_cells(nih_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """NIH's images and positives per cell, read by fedcxr's NIH adapter (metadata only).

    Returns the 20 cells (:func:`cell_grid` order) with ``images`` and one positives column per
    finding, and the findings (canonical names, ``no_finding`` left out: it is no finding)."""
    from fedcxr.site_adapters.base import AdapterOptions
    from fedcxr.site_adapters.nih import SOURCE_CLASSES, read_nih

    table = read_nih(Path(nih_dir), AdapterOptions(plan=True))
    frame = table.frame
    keys = [aux_column("sex"), aux_column("age_bin"), aux_column("view")]
    frontal = frame[keys].notna().all(axis=1) & frame[aux_column("view")].isin(list(VIEW_CODES.values()))
    frame = frame.loc[frontal]
    findings = [c for c in SOURCE_CLASSES if c != "no_finding"]
    grouped = frame.groupby(keys)
    counts = grouped.size().rename("images")
    positives = grouped[[raw_column(c) for c in findings]].sum()
    positives.columns = findings
    cells = pd.concat([counts, positives], axis=1).reset_index()
    cells.columns = ["sex", "age_bin", "view", "images", *findings]
    cells = cell_grid().merge(cells, on=["sex", "age_bin", "view"], how="left").fillna(0)
    cells[["images", *findings]] = cells[["images", *findings]].astype(np.int64)
    return cells, findings


def fit_finding(cells: pd.DataFrame, finding: str) -> np.ndarray:
    """The finding's coefficients (:data:`TERMS` order) from the cells' counts (module doc)."""
    from sklearn.linear_model import LogisticRegression

    x = design(cells["sex"], cells["age_bin"], cells["view"])[:, 1:]
    k = cells[finding].to_numpy(float)
    n = cells["images"].to_numpy(float)
    keep = n > 0
    xx = np.vstack([x[keep], x[keep]])
    y = np.r_[np.ones(keep.sum()), np.zeros(keep.sum())]
    weight = np.r_[k[keep], (n - k)[keep]]
    model = LogisticRegression(C=RIDGE_C, solver="newton-cholesky", tol=1e-12, max_iter=1000).fit(xx, y, sample_weight=weight)
    return np.r_[model.intercept_, model.coef_[0]]


def derive(nih_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(findings table, mix table)`` as committed (coefficients rounded to :data:`DECIMALS`)."""
    cells, findings = nih_cells(nih_dir)
    rows = []
    total = int(cells["images"].sum())
    for finding in findings:
        coef = fit_finding(cells, finding)
        positives = int(cells[finding].sum())
        rows.append({"finding": finding, **{t: round(float(c), DECIMALS) for t, c in zip(TERMS, coef)},
                     "positives": positives, "prevalence": round(positives / total, DECIMALS)})
    mix = cells[["sex", "age_bin", "view", "images"]].copy()
    mix["sex"] = mix["sex"].map({v: k for k, v in SEX_CODES.items()})
    mix["age_bin"] = mix["age_bin"].map(dict(enumerate(AUX_VOCAB["age_bin"])))
    mix["view"] = mix["view"].map({v: k for k, v in VIEW_CODES.items()})
    return pd.DataFrame(rows), mix


def write(findings: pd.DataFrame, mix: pd.DataFrame, out: Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / FINDINGS_CSV, out / MIX_CSV]
    findings.to_csv(paths[0], index=False, float_format=f"%.{DECIMALS}f", lineterminator="\n")
    mix.to_csv(paths[1], index=False, lineterminator="\n")
    return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedcxr.synth.nih_fit", description=__doc__.split("\n\n")[0])
    p.add_argument("nih_dir", type=Path, help="the NIH ChestX-ray14 folder (Data_Entry_2017_v2020.csv.gz and "
                   "the official split lists)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                   help="where to write nih_findings.csv and nih_mix.csv (default: beside this module)")
    args = p.parse_args(argv)
    try:
        findings, mix = derive(args.nih_dir)
    except UserError as exc:  # no metadata file, an unknown label...: the adapter names the file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in write(findings, mix, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
