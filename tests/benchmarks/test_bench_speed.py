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
def test_bench_threads_measures_a_state_end_to_end():
    """One measurement (a child process training at 28 px); the loaded state is the same measurement
    inside :class:`BusyLoad` (tested below), so ``--load 0`` keeps this smoke run to one child."""
    table = load_bench("bench_threads").main(["--sizes", "28", "--load", "0", "--repeats", "1", "--steps", "1",
                                                   "--variants", "1"])
    assert list(table) == [("as is", 28, "1")] and table[("as is", 28, "1")] > 0


def test_bench_threads_busy_load_spins_one_process_per_unit_and_ends_them():
    bench = load_bench("bench_threads")
    with bench.BusyLoad(2) as load:
        assert len(load.procs) == 2 and all(p.poll() is None for p in load.procs), "spinning"
    assert all(p.returncode is not None for p in load.procs), "ended on exit"
    with bench.BusyLoad(0) as none:
        assert none.procs == []
