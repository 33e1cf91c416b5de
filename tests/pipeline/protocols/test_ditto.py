"""Ditto (protocols/ditto.py): the personal model's proximal step toward w^t, the global model's plain
step, the personal model kept at the site and evaluated there (Li et al. 2021, Algorithm 1).

The proximal step itself (v ← v − η(∇F(v) + λ(v − w^t)) with w^t not where v starts) is checked by
hand in ``tests/pipeline/test_local_fedprox_scaffold.py``; here, that a Ditto site takes exactly it.
"""

from __future__ import annotations

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.messages import EvaluateTask

from .personal_helpers import federation, max_diff, recording, same

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_site_trains_its_personal_model_toward_w_t_and_the_global_one_from_w_t(tiny_manifests, tmp_path):
    cfg, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "Ditto",
                                                     ditto={"lam": 0.5, "personal_steps": 3})
    site = recording(runners["nih_style"], calls := [])
    config = protocol.source_config(ctx, 0)
    reply0 = site.handle("train_ditto", theta0, config)
    personal0, glob0 = calls
    # round 0: v starts as w^0; λ and the personal budget reach the local loop, anchored at w^t
    assert same(personal0["params"], theta0, theta0) and personal0["hooks"]["prox_mu"] == 0.5
    assert same(personal0["hooks"]["prox_anchor"], theta0, theta0) and personal0["config"].steps == 3
    assert same(glob0["params"], theta0, theta0) and glob0["hooks"] == {}  # the global model: plain training
    assert glob0["config"].steps == cfg.source.steps and not glob0["config"].local_keys
    v0 = {k: site.local_state[k].clone() for k in theta0}  # the personal model, kept under the model's names
    assert not same(v0, reply0.params, [k for k in theta0 if theta0[k].is_floating_point()])
    # round 1: v starts from the kept v, still anchored at the new w^1
    theta1 = {k: v + 0.01 if v.is_floating_point() else v for k, v in theta0.items()}
    calls.clear()
    site.handle("train_ditto", theta1, protocol.source_config(ctx, 1))
    assert same(calls[0]["params"], v0, theta0) and same(calls[0]["hooks"]["prox_anchor"], theta1, theta1)
    assert same(calls[1]["params"], theta1, theta1)


def test_a_larger_lambda_keeps_the_personal_model_closer_to_the_global_one(tiny_manifests, tmp_path):
    distance = {}
    for lam in (0.0, 50.0):  # η·λ = 0.5: the proximal pull contracts v toward w^t each step
        _, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "Ditto",
                                                       ditto={"lam": lam}, source={"lr": 1e-2, "batch_size": 16,
                                                                                   "steps": 12, "optimizer": "sgd",
                                                                                   "momentum": 0.0})
        site = runners["nih_style"]
        site.handle("train_ditto", theta0, protocol.source_config(ctx, 0))
        keys = [k for k, v in theta0.items() if v.is_floating_point() and not k.endswith(("running_mean",
                                                                                            "running_var"))]
        distance[lam] = sum(float((site.local_state[k] - theta0[k]).norm()) for k in keys)
    assert distance[50.0] < 0.5 * distance[0.0]


def test_each_site_is_evaluated_with_its_own_personal_model(tiny_manifests, tmp_path):
    cfg, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "Ditto")
    assert protocol.default_eval_sites(ctx) == ctx.sources
    keys = protocol.eval_local_keys(ctx)
    assert keys == list(theta0)  # every entry is personal
    site = runners["chexpert_style"]
    site.handle("train_ditto", theta0, protocol.source_config(ctx, 0))
    personal = {k: site.local_state[k].clone() for k in theta0}
    task = EvaluateTask.build(head_classes=ctx.classes, param_classes=ctx.classes, split="val", local_keys=keys)
    model, *_ = site.prepared_model(theta0, task)  # what `evaluate` scores: θ0 sent, the site's own entries
    scored = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    assert max_diff(scored, personal) == 0.0 and max_diff(personal, theta0) > 0


def test_the_server_averages_the_global_models_only(tiny_manifests, tmp_path):
    cfg, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "Ditto")
    state, metrics = protocol.run_round(ctx, 0, protocol.init_state(ctx, theta0))
    assert set(metrics["train"]) == set(ctx.sources) and all("personal_loss" in m for m in metrics["train"].values())
    personal = [{k: r.local_state[k] for k in theta0} for r in runners.values()]
    assert all(max_diff(state["global"], p) > 0 for p in personal)  # never the personal models


def test_ditto_refuses_what_it_cannot_combine(tiny_manifests, tmp_path):
    with pytest.raises(UserError, match="personal model keeps every entry at the site already"):
        federation(tiny_manifests, tmp_path / "cache", "Ditto", backbone_aggregation="fedbn")
    with pytest.raises(UserError, match="ditto.lam"):
        federation(tiny_manifests, tmp_path / "cache", "Ditto", ditto={"lam": -1})
