"""Smoke test of benchmarks/bench_scale.py (100 sites against 5): tiny, it checks that the script
runs both federations from the same images and reports what BENCHMARKS.md quotes, never a speed."""

from __future__ import annotations

import pytest

from .conftest import load_bench


def test_the_table_gives_medians_and_ratios_to_the_smallest_federation():
    bench = load_bench("bench_scale")
    run = {"startup": 5.0, "rounds": [4.0, 1.0, 3.0], "cpu": [2.0, 1.0, 1.0], "peak_mb": 500.0, "line_chars": 90}
    big = {"startup": 6.0, "rounds": [8.0, 1.5, 1.5], "cpu": [3.0, 1.2, 1.4], "peak_mb": 600.0, "line_chars": 150}
    rows = bench.table({5: [run], 100: [big, {**big, "rounds": [10.0, 2.5, 2.5], "peak_mb": 700.0}]})
    assert rows[5]["steady"] == 2.0 and rows[100]["steady"] == 2.0  # the median of the rounds after the first
    assert rows[100]["ratios"] == pytest.approx({"first": 9.0 / 4.0, "steady": 1.0, "steady_cpu": 1.3,
                                                 "first_cpu": 1.5, "peak": 1.3})
    assert rows[100]["startup_cold"] == 6.0 and rows[100]["chars"] == 150
    lines = bench.summary(rows)
    assert len(lines) == 3 and lines[2].split("|")[0].strip() == "100"


def test_the_floor_table_puts_fedcxrs_steady_cpu_beside_the_plain_pytorch_floor():
    bench = load_bench("bench_scale")
    lines = bench.floor_lines({5: 1.0, 100: 1.5}, {5: {"steady_cpu": 1.1}, 100: {"steady_cpu": 2.6}})
    cells = [[c.strip() for c in line.split("|")] for line in lines[1:]]
    assert cells == [["5", "1.00", "1.00", "1.10", "0.10"], ["100", "1.50", "1.50", "2.60", "1.10"]]
    assert len(bench.floor_lines({5: 1.0, 100: 1.5})[1].split("|")) == 3  # --floor-only: no fedcxr columns


@pytest.mark.slow
def test_bench_scale_trains_each_federation_in_its_own_process(small_npz, tmp_path, capsys):
    rows = load_bench("bench_scale").main(["--input", str(small_npz), "--sites", "2", "4", "--rounds", "2",
                                           "--repeats", "1", "--work", str(tmp_path / "work")])
    assert list(rows) == [2, 4]
    for v in rows.values():
        assert v["steady"] > 0 and v["first"] > 0 and v["peak"] > 0 and v["steady_cpu"] > 0
        assert 0 < v["chars"] < 200  # the round line of train.log was found and measured
        assert v["floor_cpu"] > 0  # the plain-PyTorch floor over the same sites' batches ran
    assert rows[2]["ratios"]["steady"] == 1.0 and rows[4]["ratios"]["peak"] > 0
    out = capsys.readouterr().out
    assert "2 sites: start-up" in out and "4 sites: start-up" in out and "load average at end" in out
    assert "the training floor" in out
    runs = sorted(p.name for p in (tmp_path / "work" / "runs").iterdir())
    assert runs == ["n2-r0", "n4-r0"]
    assert (tmp_path / "work" / "iid4" / "site-4").is_dir()  # the same images dealt to four sites
