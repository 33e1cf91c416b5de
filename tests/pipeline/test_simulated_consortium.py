"""A simulated consortium (fedcxr.pipeline.simulated_consortium): late replies discarded after the site
trained, drop-outs never asked, each round's simulated time; tasks outside a round pass untimed."""

from __future__ import annotations

import torch

from fedcxr.pipeline.config_consortium import SimulateConfig
from fedcxr.pipeline.messages import EvaluateTask, TrainTask
from fedcxr.pipeline.simulated_consortium import SimulatedConsortium, clock_record

from .protocols.scripted import ScriptedSites, reply

STEPS = {"fast": 2, "slow": 50, "gone": 2}


def _answer(task, site, params, config):
    return reply(site, {"w": torch.zeros(4)}, n_batches=STEPS[site])


def _task(r: int) -> TrainTask:
    return TrainTask.build(round=r, seed=0, role="source", head_classes=["edema"], param_classes=["edema"],
                           lr=1e-3, batch_size=4)


def _consortium(deadline_s=10.0, **spec) -> SimulatedConsortium:
    spec = SimulateConfig(step_s=0.5, latency_s=1.0, sites={"gone": {"dropout": 0.99}}, **spec)
    return SimulatedConsortium(ScriptedSites(_answer, list(STEPS)), spec, seed=0, deadline_s=deadline_s,
                               sources=list(STEPS))


def test_a_late_site_trains_but_its_reply_is_discarded_and_a_dropped_site_is_not_asked():
    sim = _consortium()
    replies = sim.run("train", list(STEPS), {"w": torch.zeros(4)}, _task(3))
    assert list(replies) == ["fast"]
    assert [site for _, site, _, _ in sim.inner.calls] == ["fast", "slow"], "the late site trained; gone did not"
    assert sim.absent["slow"]["why"] == "late" and "reply at 27.0 s, after the 10 s deadline" in \
        sim.absent["slow"]["reason"]  # 1 + 50·0.5 + 1
    assert sim.absent["gone"]["why"] == "dropped" and "dropped out of round 4" in sim.absent["gone"]["reason"]
    assert sim.round_record(3) == {"round_s": 10.0, "late": ["slow"], "dropped": ["gone"]}
    history = [{"round": 2, "simulated": {"round_s": 4.0, "clock_s": 40.0}}]
    assert clock_record(sim, 3, history) == {"simulated": {"round_s": 10.0, "clock_s": 50.0, "late": ["slow"],
                                                           "dropped": ["gone"]}}


def test_every_round_task_adds_to_the_round_and_tasks_outside_a_round_pass_untimed():
    sim = _consortium(deadline_s=None)
    sim.run("train", ["fast", "slow"], {"w": torch.zeros(4)}, _task(0))
    sim.run("train", ["fast"], {"w": torch.zeros(4)}, _task(0))
    assert sim.round_record(0) == {"round_s": 27.0 + 3.0, "late": [], "dropped": []}  # no deadline: wait for slow
    config = EvaluateTask.build(head_classes=["edema"], param_classes=["edema"])
    assert list(sim.run("evaluate", list(STEPS), {"w": torch.zeros(4)}, config)) == list(STEPS)
    assert sim.round_record(0)["round_s"] == 30.0 and not sim.absent


def test_bandwidth_charges_the_models_bytes_each_way():
    sim = _consortium(deadline_s=None, bandwidth_mbit_s=8e-6)  # 1 byte per second
    sim.run("train", ["fast"], {"w": torch.zeros(4)}, _task(0))  # 16 bytes out, 16 back
    assert sim.round_record(0)["round_s"] == 1.0 + 16 + 2 * 0.5 + 1.0 + 16
