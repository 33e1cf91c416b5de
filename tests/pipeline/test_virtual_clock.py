"""A simulated consortium's clock (fedcxr.pipeline.virtual_clock): reply times, drop-outs, deadlines."""

from __future__ import annotations

import math

import pytest
import torch

from fedcxr.pipeline.config_consortium import SimulateConfig
from fedcxr.pipeline.virtual_clock import (Timing, close_task, draw, drops_out, reply_seconds, site_timings,
                                           state_bytes, transfer_seconds)


def test_a_reply_arrives_after_latency_transfer_and_compute_each_way():
    site = Timing(speed=2.0, latency_s=0.5, dropout=0.0)
    assert reply_seconds(site, steps=10, step_s=0.3) == pytest.approx(0.5 + 10 * 0.3 / 2 + 0.5)
    # 1 MB each way over 8 Mbit/s: 1 s each
    assert reply_seconds(site, steps=0, step_s=0.3, sent_bytes=10**6, reply_bytes=2 * 10**6,
                         bandwidth_mbit_s=8.0) == pytest.approx(0.5 + 1.0 + 0.5 + 2.0)
    assert transfer_seconds(10**9, None) == 0.0
    assert state_bytes({"w": torch.zeros(10, dtype=torch.float32), "n": torch.zeros((), dtype=torch.int64)}) == 48


def test_site_draws_are_seeded_per_site_and_fixed_values_win():
    spec = SimulateConfig(speed={"median": 2.0, "spread": 0.5}, latency_s=1.5, dropout=0.2,
                          sites={"slow": {"speed": 0.1, "dropout": 0.9}})
    one = site_timings(spec, ["a", "b", "slow"], ["target"], seed=3)
    more = site_timings(spec, ["a", "b", "c", "slow"], ["target"], seed=3)
    assert one == site_timings(spec, ["a", "b", "slow"], ["target"], seed=3)
    assert one["a"] == more["a"] and one["b"] == more["b"], "adding a site changes no other site's draw"
    assert one["a"].speed != one["b"].speed and one["a"].latency_s == one["b"].latency_s == 1.5
    assert one["slow"] == Timing(speed=0.1, latency_s=1.5, dropout=0.9)
    assert one["target"].dropout == 0.0 and one["a"].dropout == 0.2, "the target drops out only where sites: says"
    assert site_timings(spec, ["a"], [], seed=4)["a"] != one["a"]
    draws = [draw({"median": 2.0, "spread": 0.5}, 0, "speed", f"s{i}") for i in range(2000)]
    logs = sorted(math.log(d) for d in draws)
    assert logs[1000] == pytest.approx(math.log(2.0), abs=0.05)  # the median
    sd = math.sqrt(sum((x - math.log(2.0)) ** 2 for x in logs) / len(logs))
    assert sd == pytest.approx(0.5, abs=0.03)


def test_drop_outs_are_one_draw_per_site_and_round_at_the_stated_rate():
    site = Timing(speed=1.0, latency_s=0.0, dropout=0.3)
    out = [drops_out(site, 0, r, "a") for r in range(2000)]
    assert out == [drops_out(site, 0, r, "a") for r in range(2000)]
    assert 0.26 < sum(out) / len(out) < 0.34
    assert not any(drops_out(Timing(1.0, 0.0, 0.0), 0, r, "a") for r in range(100))


def test_a_task_closes_at_the_last_reply_or_at_the_deadline():
    assert close_task({"a": 3.0, "b": 5.0}, deadline_s=10.0) == (5.0, [])
    assert close_task({"a": 3.0, "b": 12.0, "c": 11.0}, deadline_s=10.0) == (10.0, ["b", "c"])
    assert close_task({"a": 3.0, "b": None}, deadline_s=10.0) == (10.0, []), "a drop-out looks like a slow site"
    assert close_task({"a": 3.0, "b": None}, deadline_s=None) == (3.0, [])
    assert close_task({"a": 30.0}, deadline_s=None) == (30.0, [])
    assert close_task({}, deadline_s=10.0) == (0.0, [])
