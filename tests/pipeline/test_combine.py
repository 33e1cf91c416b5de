"""GP/FedDA/FedGP applied from a round's spec (fedcxr.pipeline.combine) and the train_combine payload."""

from __future__ import annotations

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.combine import combine
from fedcxr.pipeline.messages import pack_combine as pack
from fedcxr.pipeline.messages import unpack_combine as unpack
from fedcxr.pipeline.state import delta


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"conv.weight": torch.randn(3, 2, generator=g), "bn.running_mean": torch.randn(3, generator=g),
            "bn.num_batches_tracked": torch.tensor(5)}


SPEC = {"n_sources": [30, 10], "n_batches": [3, 1], "bs_source": 10, "bs_target": 5, "lr_source": 1e-3,
        "lr_target": 5e-4, "epochs_source": 1, "epochs_target": 1, "beta": 0.3}


def test_pack_and_unpack_round_trip():
    theta0, deltas = _state(0), [_state(1), _state(2)]
    back0, back = unpack(pack(theta0, deltas), 2)
    assert back0.keys() == theta0.keys() and all(torch.equal(back0[k], theta0[k]) for k in theta0)
    for d, b in zip(deltas, back):
        assert all(torch.equal(d[k], b[k]) for k in d)


@pytest.mark.parametrize("rule", ["gp", "fedda", "fedgp"])
def test_combine_calls_the_pure_rule_with_the_sources_rebuilt(rule):
    theta0, target = _state(0), _state(3)
    sources = [_state(1), _state(2)]
    deltas = [delta(s, theta0) for s in sources]
    got, betas = combine(theta0, target, deltas, {**SPEC, "rule": rule}, n_target=15, batch_updates=None)
    scale = dict(n_sources=[30, 10], n_target=15, bs_source=10, bs_target=5, lr_source=1e-3, lr_target=5e-4,
                 epochs_source=1, epochs_target=1)
    if rule == "gp":
        want = agg.gp(theta0, target, sources, beta=0.3, **scale)
    elif rule == "fedda":
        want = agg.fedda(theta0, target, sources, betas=[0.3, 0.3], n_sources=[30, 10])
    else:
        want = agg.fedgp(theta0, target, sources, betas=[0.3, 0.3], **scale)
    assert betas == [0.3, 0.3]
    for key in want:
        assert torch.allclose(got[key].float(), want[key].float(), atol=1e-6), key


def test_auto_weighting_needs_two_target_batches():
    theta0 = _state(0)
    with pytest.raises(UserError, match="two target batches"):
        combine(theta0, _state(3), [delta(_state(1), theta0)], {**SPEC, "n_sources": [30], "n_batches": [3],
                "rule": "fedgp", "auto": True}, n_target=15, batch_updates=torch.zeros(1, 9))


def test_combine_scales_gp_by_the_real_step_counts():
    """The target's step count reaches the rule: twice the target steps, twice the sources' part (β=1)."""
    theta0, target = _state(0), _state(3)
    deltas = [delta(_state(1), theta0), delta(_state(2), theta0)]
    spec = {**SPEC, "rule": "gp", "beta": 1.0}
    one, _ = combine(theta0, target, deltas, spec, n_target=15, batch_updates=None, target_steps=3)
    two, _ = combine(theta0, target, deltas, spec, n_target=15, batch_updates=None, target_steps=6)
    key = "conv.weight"
    assert torch.allclose(two[key] - theta0[key], 2 * (one[key] - theta0[key]), atol=1e-6)
