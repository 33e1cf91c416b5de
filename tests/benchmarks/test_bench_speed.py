"""Smoke tests of the speed benchmarks (loader, augmentation, round vs floor, threads), each tiny:
they check that the scripts run and report the ratios BENCHMARKS.md quotes, never a speed."""

from __future__ import annotations

import pytest
import torch

from .conftest import load_bench


def test_bench_loader_reports_every_contender_and_the_ratios(capsys):
    out = load_bench("bench_loader").main(["--size", "16", "--n", "48", "--batch-size", "8", "--repeats", "1",
                                           "--min-seconds", "0"])
    assert set(out["rates"]) == {"fedcxr batch", "fedcxr per item", "MONAI CacheDataset", "MONAI PersistentDataset",
                                 "fedcxr batch + augment", "fedcxr per item + augment", "MONAI CacheDataset + Rand*d"}
    assert all(rate > 0 for rate in out["rates"].values())
    assert {"batch / CacheDataset", "augmented: batch / per item"} <= set(out["ratios"])
    assert set(out["cpu_ratios"]) == set(out["ratios"]) and all(r > 0 for r in out["cpu_ratios"].values())
    assert "load average" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_round_compares_fedcxr_with_the_floor(tmp_path):
    previous = torch.get_num_threads()
    out = load_bench("bench_round").main(["--sites", "2", "--images-per-site", "24", "--size", "16", "--rounds", "2",
                                          "--steps", "2", "--batch-size", "8", "--repeats", "1", "--skip-flower"])
    assert set(out["medians"]) == {"fedcxr", "floor"} and out["ratios"]["fedcxr / floor"] > 0
    assert torch.get_num_threads() == previous  # the benchmark's one thread is not left behind


@pytest.mark.slow
def test_bench_threads_measures_idle_and_loaded_states():
    table = load_bench("bench_threads").main(["--sizes", "28", "--load", "1", "--repeats", "1", "--steps", "1",
                                                   "--variants", "1"])
    states = {state for state, _, _ in table}
    assert states == {"as is", "+1 busy"}
    assert all(value > 0 for value in table.values())
