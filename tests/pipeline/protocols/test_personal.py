"""What the personalised methods share (fedcxr.pipeline.protocols.personal), on scripted sites: each site
judged by its own model on its own split, the personal layers kept out of the server's average, the
network's entries listed without touching the run's random stream."""

from __future__ import annotations

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.protocols import get_protocol
from fedcxr.pipeline.protocols.personal import PersonalLayersProtocol, model_keys, projection_keys

from .scripted import context, reply, tensors

SITES = {"a": 1, "b": 3}  # each source's sample count


def own_layers(task, site, params, config):
    """A site answers its number in the shared entries and 100 + it in its own head."""
    value = float(list(SITES).index(site) + 1)
    return reply(site, {"w": torch.full_like(params["w"], value), "head.w": torch.full_like(params["head.w"], 100 + value)},
                 n_samples=SITES[site])


def test_the_personal_layers_stay_out_of_the_average_and_each_site_is_judged_on_its_own_split():
    ctx = context("FedPer", own_layers, sites=list(SITES), head_keys=["head.w"])
    protocol = get_protocol("FedPer")
    assert isinstance(protocol, PersonalLayersProtocol)
    theta0 = tensors(w=[8.0, 8.0], head__w=[5.0])
    state, metrics = protocol.run_round(ctx, 0, protocol.init_state(ctx, theta0))
    assert all(config["local_keys"] == ("head.w",) for _, _, config in ctx.transport.sent("train"))
    assert state["global"]["w"].tolist() == [(1 * 1 + 3 * 2) / 4] * 2  # the shared body: sample-weighted
    assert state["global"]["head.w"].tolist() == [5.0]  # θ0's: no site's own head is averaged into it
    assert metrics["n_samples"] == SITES
    assert protocol.eval_local_keys(ctx) == ["head.w"] and protocol.default_eval_sites(ctx) == list(SITES)


def test_fedbn_is_refused_where_the_method_keeps_every_entry_at_the_site_already():
    ctx = context("Ditto", own_layers, sites=list(SITES), backbone_aggregation="fedbn")
    with pytest.raises(UserError, match="backbone_aggregation fedbn keeps BatchNorm entries at the sites, but the "
                                        "reason; use backbone_aggregation: fedavg"):
        get_protocol("Ditto").refuse_fedbn(ctx.cfg, "the reason")
    get_protocol("Ditto").refuse_fedbn(context("Ditto", own_layers, sites=list(SITES)).cfg, "never said")


def test_the_networks_entries_are_listed_without_drawing_from_the_runs_random_stream():
    ctx = context("Ditto", own_layers, sites=list(SITES), classes=("edema", "pneumonia"),
                  model={"backbone": "resnet_tiny", "hidden": 8})
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    keys = model_keys(ctx)
    assert torch.equal(torch.rand(3), expected)  # the network was built under a forked RNG
    assert "head.weight" in keys and len(keys) == len(set(keys))
    assert projection_keys(ctx) == [k for k in keys if k.startswith("proj.")] and projection_keys(ctx)
    flat = context("Ditto", own_layers, sites=list(SITES), model={"backbone": "resnet_tiny", "hidden": None})
    assert projection_keys(flat) == []
