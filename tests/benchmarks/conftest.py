"""Shared pieces of the benchmark smoke tests: load a script from ``benchmarks/`` as a module,
and a small slice of the real PneumoniaMNIST file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def load_bench(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_small_npz(shared_data: Path, path: Path, sizes: dict[str, int]) -> Path:
    """The first ``sizes[split]`` rows of each split of the real merged PneumoniaMNIST file."""
    data = np.load(shared_data / "medmnist" / "pneumoniamnist_merged.npz")
    arrays = {f"{s}_{k}": data[f"{s}_{k}"][:n] for s, n in sizes.items() for k in ("images", "labels")}
    np.savez(path, **arrays)
    return path


@pytest.fixture
def small_npz(shared_data, tmp_path) -> Path:
    """The first 60/20/60 train/val/test rows of the real merged PneumoniaMNIST file."""
    return write_small_npz(shared_data, tmp_path / "pneumoniamnist_small.npz", {"train": 60, "val": 20, "test": 60})
