"""NIH ChestX-ray14's sex, age and view effects on findings, as the synthetic cohorts use them.

Why: AuxInfo's auxiliary heads (sex, age bin, view) can only help where those labels share
signal with the findings. In real hospitals they do — in NIH ChestX-ray14 edema is 11 times as
frequent on AP as on PA films and fibrosis 0.3 times, cardiomegaly 0.7 times as frequent in men
as in women, hernia found on 8 of 36,439 images under 40 and 3.2 % of those over 80 — so the
synthetic hospitals take these dependencies from NIH's real metadata
(:mod:`fedcxr.synth.nih_fit` derives them; the committed tables ``nih_findings.csv`` and
``nih_mix.csv`` beside this module are all that is read here).

Two pieces:

* :func:`cell_logits`: a finding's fitted log-odds in each of the 2 × 5 × 2 cells (sex, age bin,
  frontal view), indexed ``[sex, age_bin, view]`` with F = 0, M = 1, PA = 0, AP = 1 and the age
  bins of :data:`fedcxr.vocab.AUX_VOCAB`; :func:`lift` moves them by one log-odds shift so that the
  finding's prevalence in NIH's own case mix is a chosen level (odds ratios unchanged).
* :func:`calibrate`: the cohort model adds latent factors and per-study noise to a finding's
  log-odds (for co-occurrence, :mod:`fedcxr.synth.cohort`), and the ``acute`` factor also makes
  AP views likelier. Averaged over them, ``sigmoid(t)`` is no longer the prevalence; this returns
  the offset ``o`` with ``E[sigmoid(o + Σ loading·factor + noise) | view] = sigmoid(t)`` — the
  expectation over the factors' distribution *given the view* (acute is higher on AP films), by
  Gauss–Hermite quadrature — so each cell's prevalence is ``sigmoid(t)`` again.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from scipy.special import expit

from fedcxr.synth.nih_fit import FINDINGS_CSV, MIX_CSV, SEX_CODES, TERMS, VIEW_CODES, design
from fedcxr.vocab import AUX_VOCAB

HERE = Path(__file__).resolve().parent
SHAPE = (2, len(AUX_VOCAB["age_bin"]), 2)  # sex × age bin × view

#: quadrature nodes: the acute factor (its distribution given the view is not normal) and the
#: rest of the latent sum (normal); 48 × 32 nodes agree with 4·10⁶ Monte Carlo draws within their
#: sampling error (2·10⁻⁴)
ACUTE_NODES, REST_NODES = 48, 32


@functools.lru_cache(maxsize=None)
def tables() -> tuple[pd.DataFrame, np.ndarray]:
    """``(findings table indexed by finding, NIH images per cell as a SHAPE array)``, read once."""
    findings = pd.read_csv(HERE / FINDINGS_CSV).set_index("finding")
    missing = [t for t in TERMS if t not in findings.columns]
    if missing:
        raise ValueError(f"{HERE / FINDINGS_CSV}: columns {missing} missing; re-derive it (python -m fedcxr.synth.nih_fit)")
    mix_frame = pd.read_csv(HERE / MIX_CSV)
    mix = np.zeros(SHAPE)
    ages = {name: i for i, name in enumerate(AUX_VOCAB["age_bin"])}
    for row in mix_frame.itertuples(index=False):
        mix[SEX_CODES[row.sex], ages[row.age_bin], VIEW_CODES[row.view]] = row.images
    return findings, mix


def nih_findings() -> tuple[str, ...]:
    """The findings the NIH table covers (canonical names, table order)."""
    return tuple(tables()[0].index)


def cell_logits(finding: str) -> np.ndarray:
    """The finding's fitted NIH log-odds per cell, a SHAPE array ``[sex, age_bin, view]``."""
    findings, _ = tables()
    coef = findings.loc[finding, list(TERMS)].to_numpy(float)
    sex, age, view = np.indices(SHAPE).reshape(3, -1)
    return (design(sex, age, view) @ coef).reshape(SHAPE)


def mix_prevalence(logits: np.ndarray) -> float:
    """The prevalence that cell log-odds give in NIH's own case mix (its images per cell)."""
    _, mix = tables()
    return float((mix * expit(logits)).sum() / mix.sum())


def lift(finding: str, level: float) -> float:
    """The log-odds shift that brings the finding's prevalence in NIH's case mix to ``level``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"{finding}: level {level} is not a prevalence in (0, 1)")
    logits = cell_logits(finding)
    lo, hi = -20.0, 20.0
    for _ in range(80):  # the mix prevalence rises with the shift: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mix_prevalence(logits + mid) < level else (lo, mid)
    return (lo + hi) / 2


@functools.lru_cache(maxsize=None)
def _nodes() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    ax, aw = np.polynomial.hermite_e.hermegauss(ACUTE_NODES)
    rx, rw = np.polynomial.hermite_e.hermegauss(REST_NODES)
    return ax, aw / aw.sum(), rx, rw / rw.sum()


def calibrate(targets: np.ndarray, loadings: Mapping[str, float], *, acute: str, noise_sd: float,
              ap_intercept: float, ap_slope: float) -> np.ndarray:
    """Offsets ``o`` (same shape as ``targets``, a ``[..., view]`` array with PA = 0, AP = 1) such that
    ``E[sigmoid(o + Σ loadings·z + ε) | view] = sigmoid(targets)`` (module doc).

    ``z`` ~ N(0, 1) independent factors, ``ε`` ~ N(0, ``noise_sd``²); the view is AP with probability
    ``sigmoid(ap_intercept + ap_slope·z[acute])``, so given the view the ``acute`` factor is reweighted.
    """
    targets = np.asarray(targets, dtype=float)
    ax, aw, rx, rw = _nodes()
    w_acute = float(loadings.get(acute, 0.0))
    rest_sd = float(np.sqrt(sum(w * w for f, w in loadings.items() if f != acute) + noise_sd ** 2))
    p_ap = expit(ap_intercept + ap_slope * ax)
    out = np.empty_like(targets)
    for view, given in ((0, aw * (1 - p_ap)), (1, aw * p_ap)):
        given = given / given.sum()
        # latent part at each (acute node, rest node) and its weight
        latent = (w_acute * ax[:, None] + rest_sd * rx[None, :]).ravel()
        weight = (given[:, None] * rw[None, :]).ravel()
        t = targets[..., view]
        goal = expit(t)
        lo, hi = t - 30.0, t + 30.0
        for _ in range(45):  # E[sigmoid(o + latent)] rises with o: bisection on every cell at once (to 2e-12)
            mid = (lo + hi) / 2
            below = (expit(mid[..., None] + latent) * weight).sum(axis=-1) < goal
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out[..., view] = (lo + hi) / 2
    return out
