"""Evaluation speed: the vectorised patient-level bootstrap vs a plain scikit-learn loop.

Synthetic predictions shaped like the NIH ChestX-ray14 official test split (25,596 images of
2,797 patients, 14 classes). Times, side by side:

* ``sklearn loop``: draw patients, gather their rows, ``roc_auc_score`` per class and resample
  (the textbook bootstrap), measured on ``--loop-boot`` resamples and scaled to ``--boot``;
* ``bootstrap_aurocs``: the same resamples as integer row weights, all classes at once;
* ``build_report``: the whole report (sites, per-class CIs, mean CI, subgroups);

and prints the ratio. Goal: a 1,000-resample report of an NIH-sized test set in well under a
minute on 2 CPU cores.

    python benchmarks/bench_evaluation.py [--images N] [--patients P] [--boot B] [--loop-boot L]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from fedcxr.evaluation.metrics import bootstrap_aurocs
from fedcxr.evaluation.report import build_report
from fedcxr.vocab import CLASSES

NIH = CLASSES[:14]


def synthetic(n_images: int, n_patients: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    patients = np.sort(rng.integers(0, n_patients, n_images))
    cols: dict = {"site": ["nih"] * n_images, "row_key": [f"i{i}.png" for i in range(n_images)],
                  "patient_key": patients.astype(str)}
    prevalence = rng.uniform(0.002, 0.15, len(NIH))
    for cls, prev in zip(NIH, prevalence):
        y = (rng.random(n_images) < prev).astype(float)
        cols[f"label__{cls}"] = y
        cols[f"prob__{cls}"] = 1 / (1 + np.exp(-(rng.normal(size=n_images) + 1.5 * y - 2)))
    for task, k in (("sex", 2), ("age_bin", 5), ("race", 5), ("view", 3)):
        cols[f"aux__{task}"] = pd.array(rng.integers(0, k, n_images), dtype="Int64")
    return pd.DataFrame(cols)


def sklearn_loop(frame: pd.DataFrame, n_boot: int, seed: int = 0) -> float:
    codes, uniques = pd.factorize(frame["patient_key"])
    rows_of = [np.flatnonzero(codes == g) for g in range(len(uniques))]
    y = frame[[f"label__{c}" for c in NIH]].to_numpy()
    p = frame[[f"prob__{c}" for c in NIH]].to_numpy()
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for _ in range(n_boot):
        rows = np.concatenate([rows_of[g] for g in rng.integers(0, len(uniques), len(uniques))])
        for j in range(len(NIH)):
            yy = y[rows, j]
            if 0 < yy.sum() < yy.size:
                roc_auc_score(yy, p[rows, j])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=25_596)
    parser.add_argument("--patients", type=int, default=2_797)
    parser.add_argument("--boot", type=int, default=1000)
    parser.add_argument("--loop-boot", type=int, default=20)
    args = parser.parse_args()
    frame = synthetic(args.images, args.patients)
    y = frame[[f"label__{c}" for c in NIH]].to_numpy()
    p = frame[[f"prob__{c}" for c in NIH]].to_numpy()

    loop = sklearn_loop(frame, args.loop_boot) * args.boot / args.loop_boot
    start = time.perf_counter()
    bootstrap_aurocs(y, p, frame["patient_key"].to_numpy(), n_boot=args.boot)
    vectorised = time.perf_counter() - start
    start = time.perf_counter()
    build_report(frame, {"method": "bench", "seed": 0, "classes": NIH}, split="test", n_boot=args.boot, seed=0)
    report = time.perf_counter() - start

    print(f"{args.images} images, {frame['patient_key'].nunique()} patients, {len(NIH)} classes, "
          f"{args.boot} resamples")
    print(f"{'sklearn loop (scaled)':>24} {'bootstrap_aurocs':>18} {'ratio':>7} {'build_report':>14}")
    print(f"{loop:>23.1f}s {vectorised:>17.1f}s {loop / vectorised:>6.1f}× {report:>13.1f}s")


if __name__ == "__main__":
    main()
