"""FedPer (protocols/fedper.py): every site trains base and personalization layers together; the server
averages the base only; the personalization layers stay at the sites (Arivazhagan et al. 2019)."""

from __future__ import annotations

import pytest
import torch

from .personal_helpers import federation, recording, same
from .test_fedrep import HEAD, _Fixed

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_site_trains_base_and_personal_layers_together_and_keeps_the_personal_ones(tiny_manifests, tmp_path):
    _, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "FedPer")
    site = recording(runners["nih_style"], calls := [])
    config = protocol.site_config(ctx, 0)
    reply = site.handle("train", theta0, config)
    [call] = calls
    assert call["config"].trainable == "all" and call["config"].local_keys == HEAD and call["hooks"] == {}
    moved = [k for k in theta0 if theta0[k].is_floating_point() and not torch.equal(theta0[k], reply.params[k])]
    assert set(HEAD) <= set(moved) and any(not k.startswith("head.") for k in moved)
    assert same(site.local_state, reply.params, HEAD)


def test_projection_and_head_are_personal_when_the_options_say(tiny_manifests, tmp_path):
    _, protocol, ctx, theta0, _ = federation(tiny_manifests, tmp_path / "cache", "FedPer",
                                             fedper={"personal": "projection_and_head"})
    keys = protocol.eval_local_keys(ctx)
    assert keys == ["proj.0.weight", "proj.0.bias", *HEAD] and all(k in theta0 for k in keys)
    _, protocol, ctx, _, _ = federation(tiny_manifests, tmp_path / "cache", "FedPer", backbone_aggregation="fedbn")
    assert protocol.eval_local_keys(ctx) == [*ctx.bn_keys, *HEAD]  # FedBN's statistics stay local too


def test_the_server_averages_the_base_by_training_rows_and_keeps_no_site_head(tiny_manifests, tmp_path):
    _, protocol, ctx, theta0, _ = federation(tiny_manifests, tmp_path / "cache", "FedPer",
                                             fedper={"personal": "projection_and_head"},
                                             defences={"norm_factor": None, "norm_limit": None, "check_counts": False})
    ctx.transport = _Fixed(theta0, dict(zip(ctx.sources, (1, 1, 2))))
    state, _ = protocol.run_round(ctx, 0, protocol.init_state(ctx, theta0))
    personal = protocol.personal_keys(ctx)
    base = [k for k, v in theta0.items() if v.is_floating_point() and k not in personal]
    assert all(torch.allclose(state["global"][k], torch.full_like(theta0[k], (1 + 2 + 6) / 4)) for k in base)
    assert same(state["global"], theta0, personal)
