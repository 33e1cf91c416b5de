"""FedRep (protocols/fedrep.py): head first on the frozen body, then the body with the new head frozen;
only the body is averaged, each site keeps its head (Collins et al. 2021, Algorithm 1)."""

from __future__ import annotations

import pytest
import torch

from fedcxr.pipeline.messages import Reply

from .personal_helpers import federation, recording, same

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HEAD = ("head.weight", "head.bias")


def test_a_site_trains_its_head_alone_then_its_body_alone(tiny_manifests, tmp_path):
    _, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "FedRep",
                                                   fedrep={"head_steps": 3})
    site = recording(runners["nih_style"], calls := [])
    reply = site.handle("train_fedrep", theta0, protocol.site_config(ctx, 0))
    head_call, body_call = calls
    assert head_call["config"].trainable == "head" and head_call["config"].steps == 3
    assert head_call["hooks"] == {"seed_parts": ("head",)}
    assert body_call["config"].trainable == "backbone" and body_call["config"].steps == 2  # the source budget
    after_head = body_call["params"]  # what the head phase returned: the body untouched (BN too), a new head
    body = [k for k in theta0 if not k.startswith("head.")]
    assert same(after_head, theta0, body) and not same(after_head, theta0, HEAD)
    assert same(reply.params, after_head, HEAD)  # the body phase kept the head
    assert not same(reply.params, after_head, [k for k in body if theta0[k].is_floating_point()])
    assert same(site.local_state, reply.params, HEAD)  # the head stays at the site
    assert reply.metrics["head_steps"] == 3 and reply.n_batches == 2


def test_the_next_round_starts_from_the_sites_own_head(tiny_manifests, tmp_path):
    """Round 1's head phase loads the head this site kept (a ``local_keys`` entry) over the one received."""
    _, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "FedRep",
                                                   fedrep={"head_steps": 1})
    site = runners["chexpert_style"]
    site.handle("train_fedrep", theta0, protocol.site_config(ctx, 0))
    own_head = {k: site.local_state[k].clone() for k in HEAD}
    loaded, prepare = [], site.prepared_model

    def spy(params, config):
        model, *rest = prepare(params, config)
        loaded.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
        return (model, *rest)

    site.prepared_model = spy
    theta1 = {k: v + 0.5 if v.is_floating_point() else v for k, v in theta0.items()}
    site.handle("train_fedrep", theta1, protocol.site_config(ctx, 1))
    body = [k for k in theta0 if not k.startswith("head.")]
    assert same(loaded[0], own_head, HEAD) and same(loaded[0], theta1, body)
    assert not same(own_head, theta1, HEAD)


class _Fixed:
    """Sources answer with fixed models: the body is the site's number, the head 100 + it."""

    def __init__(self, theta0, counts):
        self.theta0, self.counts, self.site_names = theta0, counts, list(counts)

    def run(self, task, targets, params, config, *, per_site=None):
        out = {}
        for i, s in enumerate(targets):
            value = float(i + 1)
            params = {k: (torch.full_like(v, 100 + value) if k.startswith("head.") else torch.full_like(v, value))
                      if v.is_floating_point() else v.clone() for k, v in self.theta0.items()}
            out[s] = Reply(site=s, params=params, n_samples=self.counts[s], n_batches=1, class_set=["edema"])
        return out


def test_the_server_averages_the_body_by_training_rows_and_never_the_heads(tiny_manifests, tmp_path):
    cfg, protocol, ctx, theta0, _ = federation(tiny_manifests, tmp_path / "cache", "FedRep",
                                               defences={"norm_factor": None, "norm_limit": None, "check_counts": False})
    ctx.transport = _Fixed(theta0, dict(zip(ctx.sources, (1, 1, 2))))
    state, _ = protocol.run_round(ctx, 0, protocol.init_state(ctx, theta0))
    expected = (1 * 1 + 1 * 2 + 2 * 3) / 4  # sample-weighted, as PFLlib's serverrep
    body = [k for k, v in theta0.items() if v.is_floating_point() and not k.startswith("head.")]
    assert all(torch.allclose(state["global"][k], torch.full_like(theta0[k], expected)) for k in body)
    assert same(state["global"], theta0, HEAD)  # the server's head is θ0's: every site evaluates with its own
    assert protocol.eval_local_keys(ctx) == list(HEAD) and protocol.per_site_heads
