"""A tiny federation built once per test session: synthetic hospitals → ingested manifests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_manifests(tmp_path_factory) -> Path:
    """Four synthetic hospitals (48 images each, 32 px) ingested into ``<tmp>/manifests``."""
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    root = tmp_path_factory.mktemp("federation")
    write_synthetic_export(root / "export", images_per_site=48, image_size=32, seed=1)
    ingest_synthetic(root / "export", root / "manifests", progress=False)
    return root / "manifests"


def tiny_config(manifests: Path, cache: Path, **overrides) -> dict:
    """A config small enough for a 2-core test: resnet_tiny at 32 px, two short rounds."""
    data = {
        "name": "tiny",
        "manifests": str(manifests),
        "sites": ["nih_style", "chexpert_style"],
        "target": "dicom_style",
        "strategy": "FedAvg_Finetune",
        "rounds": 2,
        "source": {"lr": 2e-3, "batch_size": 16, "steps": 2},
        "target_train": {"lr": 1e-3, "batch_size": 16, "steps": 2, "labeled": 0.5},
        "model": {"backbone": "resnet_tiny", "hidden": 16},
        "image_size": 32,
        "augment": False,
        "device": "cpu",
        "seed": 0,
        "cache_dir": str(cache),
        "eval_every": 1,
    }
    for key, value in overrides.items():
        data[key] = value
    return data
