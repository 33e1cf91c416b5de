"""FedBABU (protocols/fedbabu.py): the head stays at its initialisation while the bodies are averaged;
after the last round every site fine-tunes the whole model and keeps it (Oh et al. 2022, Algorithm 1)."""

from __future__ import annotations

import pytest

from .personal_helpers import federation, max_diff, same
from .test_fedrep import HEAD

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_head_never_trains_during_the_rounds_and_each_site_fine_tunes_after_the_last(tiny_manifests, tmp_path):
    cfg, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "FedBABU",
                                                     fedbabu={"finetune_steps": 3})
    state = protocol.init_state(ctx, theta0)
    state, metrics = protocol.run_round(ctx, 0, state)  # round 0 of 2: no fine-tuning yet
    assert "finetune" not in metrics and not any(r.local_state for r in runners.values())
    assert max_diff({k: state["global"][k] for k in HEAD}, {k: theta0[k] for k in HEAD}) < 1e-6  # frozen head
    body = [k for k, v in theta0.items() if v.is_floating_point() and not k.startswith("head.")]
    assert not same(state["global"], theta0, body)
    state, metrics = protocol.run_round(ctx, 1, state)  # the last round: every site fine-tunes the whole model
    assert set(metrics["finetune"]) == set(ctx.sources)
    for name, runner in runners.items():
        personal = {k: runner.local_state[k] for k in theta0}
        assert not same(personal, state["global"], HEAD), name  # the head learnt at last
        assert max_diff(personal, state["global"]) > 0, name
    assert protocol.eval_local_keys(ctx) == list(theta0) and protocol.default_eval_sites(ctx) == ctx.sources
