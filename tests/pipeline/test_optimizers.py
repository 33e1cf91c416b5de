"""The local optimiser (fedcxr.pipeline.optimizers): one kept per network, cleared, is a fresh one."""

from __future__ import annotations

import pytest
import torch

from fedcxr.pipeline.local import LocalConfig, train_local
from fedcxr.pipeline.optimizers import fresh_optimizer

from .test_local import loader, toy_dataset, toy_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _sites_in_turn(model, keep: bool, optimizer: str, kept_state: bool = False) -> list[dict]:
    """Three simulated sites train in turn from the same weights on one shared network, as a round does;
    ``keep=False`` drops the network's kept optimiser before each (every site a new one, as before)."""
    start = {k: v.clone() for k, v in model.state_dict().items()}
    out, moments = [], {}
    for site, lr in enumerate((1e-2, 3e-3, 1e-2)):
        if not keep:
            model.__dict__.pop("_fedcxr_optimizer", None)
        model.load_state_dict(start)
        cfg = LocalConfig(lr=lr, batch_size=8, epochs=1, optimizer=optimizer, momentum=0.9)
        result = train_local(model, loader(toy_dataset(n=24, seed=site), seed=site), cfg, device="cpu", seed=site,
                             optimizer_state=moments if kept_state else None)
        moments = result.optimizer_state or {}
        out.append({k: v.clone() for k, v in model.state_dict().items()})
    return out


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_kept_optimizer_cleared_trains_bit_for_bit_as_a_new_one_at_every_site(optimizer):
    """Issue 31 item 4: a hundred sites no longer build an optimiser each; the weights are the same."""
    kept = _sites_in_turn(toy_model(), True, optimizer)
    new = _sites_in_turn(toy_model(), False, optimizer)
    for a, b in zip(kept, new):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_kept_optimizer_continues_a_site_s_own_moments_as_a_new_one_does():
    """``keep_optimizer``: the state loaded into the kept optimiser is the site's, not the last site's."""
    kept = _sites_in_turn(toy_model(), True, "adam", kept_state=True)
    new = _sites_in_turn(toy_model(), False, "adam", kept_state=True)
    for a, b in zip(kept, new):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_kept_optimizer_is_reused_only_for_the_same_parameters_and_settings():
    model = toy_model()
    params = list(model.parameters())
    first = fresh_optimizer(model, params, optimizer="adam", lr=1e-3)
    assert fresh_optimizer(model, params, optimizer="adam", lr=5e-3) is first
    assert first.param_groups[0]["lr"] == 5e-3 and not first.state
    assert fresh_optimizer(model, params[:3], optimizer="adam", lr=1e-3) is not first
    other = fresh_optimizer(model, params[:3], optimizer="adam", lr=1e-3)
    assert fresh_optimizer(model, params[:3], optimizer="adam", lr=1e-3, weight_decay=0.1) is not other
    assert isinstance(fresh_optimizer(model, params, optimizer="sgd", lr=1e-3), torch.optim.SGD)


def test_the_kept_optimizer_holds_no_moments_between_calls():
    """A site's own network (FedBN, PFL heads) keeps its optimiser object, not twice its parameters."""
    model = toy_model()
    result = train_local(model, loader(toy_dataset(n=16)), LocalConfig(lr=1e-3, batch_size=8, epochs=1),
                         device="cpu", seed=0, optimizer_state={})
    assert result.optimizer_state, "the state was read before it was cleared"
    assert not model.__dict__["_fedcxr_optimizer"][1].state
