"""Synthetic runs for the evaluation tests: ``run.json`` + ``predictions/<split>.parquet``.

Labels and demographics depend only on ``data_seed`` (so runs of several methods share the
same test images, as real runs do); probabilities depend on ``model_seed`` and ``skill``
(the separation of positives from negatives in logit units; 0 = chance).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import pytest

CLASSES = ["atelectasis", "cardiomegaly", "edema", "pleural_effusion", "hernia"]


def synthetic_predictions(
    *,
    sites: Sequence[str] = ("site-a", "site-b"),
    classes: Sequence[str] = CLASSES,
    patients_per_site: int = 60,
    images_per_patient: int = 2,
    skill: float = 2.0,
    data_seed: int = 0,
    model_seed: int = 0,
    all_negative: Sequence[str] = ("hernia",),
    prevalence: float = 0.3,
) -> pd.DataFrame:
    data_rng = np.random.default_rng(data_seed)
    model_rng = np.random.default_rng(1000 + model_seed)
    frames = []
    for s, site in enumerate(sites):
        n = patients_per_site * images_per_patient
        patient = np.repeat(np.arange(patients_per_site), images_per_patient)
        # pseudonymous keys in a recognisable shape, so tests can probe outputs for leaks
        cols = {"site": [site] * n,
                "row_key": [f"RK{s}{i:05d}ZW" for i in range(n)],
                "patient_key": [f"PX{s}{p:05d}QZ" for p in patient]}
        for cls in classes:
            y = (data_rng.random(n) < prevalence).astype(float)
            if cls in all_negative:
                y[:] = 0.0
            y[data_rng.random(n) < 0.1] = np.nan
            logit = model_rng.normal(size=n) + skill * np.nan_to_num(y) - skill / 2
            cols[f"label__{cls}"] = y
            cols[f"prob__{cls}"] = 1.0 / (1.0 + np.exp(-logit))
        sex = pd.array(data_rng.integers(0, 2, n), dtype="Int64")
        sex[:3] = pd.NA
        cols["aux__sex"] = sex
        cols["aux__age_bin"] = pd.array(data_rng.choice([1, 2, 3, 4], n, p=[0.3, 0.3, 0.35, 0.05]), dtype="Int64")
        cols["aux__race"] = pd.array(data_rng.choice([0, 1, 2], n, p=[0.6, 0.3, 0.1]), dtype="Int64")
        cols["aux__view"] = pd.array(data_rng.integers(0, 3, n), dtype="Int64")
        frames.append(pd.DataFrame(cols))
    return pd.concat(frames, ignore_index=True)


def write_run(
    run_dir: Path,
    predictions: Optional[pd.DataFrame] = None,
    *,
    method: str = "FedAvg",
    seed: int = 0,
    target: Optional[str] = None,
    classes: Sequence[str] = CLASSES,
    split: str = "test",
) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    sites = sorted(set(predictions["site"])) if predictions is not None else []
    info = {"method": method, "seed": seed, "target": target, "classes": list(classes),
            "sites": sites, "eval_sites": sites, "config": {"rounds": 1}}
    (run_dir / "run.json").write_text(json.dumps(info))
    if predictions is not None:
        (run_dir / "predictions").mkdir(exist_ok=True)
        predictions.to_parquet(run_dir / "predictions" / f"{split}.parquet", index=False)
    return run_dir


@pytest.fixture
def make_predictions():
    return synthetic_predictions


@pytest.fixture
def make_run():
    return write_run
