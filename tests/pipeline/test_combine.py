"""GP/FedDA/FedGP applied from a round's spec (fedcxr.pipeline.combine) and the train_combine payload."""

from __future__ import annotations

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.combine import combine
from fedcxr.pipeline.protocols.target_combine import pack_combine as pack
from fedcxr.pipeline.protocols.target_combine import unpack_combine as unpack
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


# --------------------------------------------------------------------------- auto-weighting alignment


def _mean_step(lr: float) -> float:
    """Mean |per-step change| of a small regression trained with Adam at ``lr`` (same data, same init)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 10, generator=g), torch.randn(64, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps = []
    for i in range(8):
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8]).backward()
        opt.step()
        steps.append((torch.cat([p.detach().flatten() for p in model.parameters()]) - before).abs().mean())
    return float(torch.stack(steps).mean())


def test_a_step_moves_the_weights_by_about_its_learning_rate():
    """The evidence for the alignment factor: ten times the lr, ten times the step (Adam)."""
    ratio = _mean_step(1e-3) / _mean_step(1e-4)
    assert 9.0 < ratio < 11.0


def _auto_case(lr_target: float, lr_source: float = 1e-3, batches: int = 4):
    """Target steps of size ∝ lr_T in fixed directions; one source whose steps are ∝ lr_S."""
    g = torch.Generator().manual_seed(5)
    theta0 = {"conv.weight": torch.zeros(30), "bn.running_mean": torch.zeros(4)}
    directions = torch.randn(6, 34, generator=g)
    directions[:, 30:] = 0.01 * torch.randn(6, 4, generator=g)  # BN statistics: the same whatever the lr
    updates = directions.clone()
    updates[:, :30] *= lr_target
    source_dir = torch.randn(30, generator=g)
    delta = {"conv.weight": lr_source * batches * (directions[:, :30].mean(0) + 3.0 * source_dir),
             "bn.running_mean": batches * directions[:, 30:].mean(0)}
    spec = {"rule": "fedda", "n_batches": [batches], "lr_source": lr_source, "lr_target": lr_target}
    return theta0, [delta], spec, updates


def test_fedda_auto_beta_does_not_depend_on_the_target_learning_rate_once_aligned():
    """With lr_S/lr_T, a target trained at 1e-4 or 3e-4 in the same directions gets the same β;
    the authors' lr_T/lr_S would give two different β for the same domains."""
    from fedcxr.pipeline.combine import auto_betas

    betas = [auto_betas(*_auto_case(lr)[:3], _auto_case(lr)[3]) for lr in (1e-4, 3e-4)]
    assert betas[0] == pytest.approx(betas[1], rel=1e-4)
    authors = []
    for lr in (1e-4, 3e-4):
        theta0, deltas, spec, updates = _auto_case(lr)
        s = agg.source_step_update(torch.cat([deltas[0]["conv.weight"], deltas[0]["bn.running_mean"]]), 4)
        authors.append(float(agg.auto_betas(updates * (lr / 1e-3), s[None], rule="fedda")["betas"][0]))
    assert authors[0] != pytest.approx(authors[1], rel=1e-2)


def test_fedgp_auto_beta_does_not_depend_on_the_alignment_factor():
    """σ² and τ²d² both scale with the square of the factor: FedGP_Auto's β is the same either way."""
    g = torch.Generator().manual_seed(6)
    updates = torch.randn(1, 50, generator=g) + torch.randn(6, 50, generator=g)  # a target direction + noise
    s = torch.randn(1, 50, generator=g)  # a source pointing elsewhere
    betas = [float(agg.auto_betas(updates * c, s, rule="fedgp")["betas"][0]) for c in (0.04, 1.0, 25.0)]
    assert 0.01 < betas[0] < 0.99
    assert betas == pytest.approx([betas[0]] * 3, rel=1e-6)
    fedda = [float(agg.auto_betas(updates * c, s, rule="fedda")["betas"][0]) for c in (0.04, 1.0, 25.0)]
    assert fedda[0] != pytest.approx(fedda[2], rel=1e-2)  # FedDA's β does depend on it


def test_alignment_scales_parameters_and_leaves_bn_running_statistics():
    from fedcxr.pipeline.combine import aligned_target_updates

    theta0 = _state(0)  # conv.weight (6 values), bn.running_mean (3), num_batches_tracked (0-dim, left out)
    got = aligned_target_updates(theta0, torch.ones(2, 9), {"lr_source": 1e-3, "lr_target": 2e-4})
    assert torch.allclose(got[:, :6], torch.full((2, 6), 5.0))
    assert torch.equal(got[:, 6:], torch.ones(2, 3))
