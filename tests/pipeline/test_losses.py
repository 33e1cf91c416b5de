"""The local loss (fedcxr.pipeline.losses): masked BCE over observed entries, aux CE over known values."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedcxr.pipeline.losses import aux_ce, masked_bce


def test_masked_bce_is_the_mean_over_observed_entries():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]], requires_grad=True)
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    p = torch.sigmoid(logits.detach())
    expected = -(torch.log(p[0, 0]) + torch.log(1 - p[0, 1]) + torch.log(p[1, 1]) + torch.log(1 - p[1, 2])) / 4
    loss = masked_bce(logits, targets, mask)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert logits.grad[0, 2] == 0 and logits.grad[1, 0] == 0  # masked entries get no gradient
    # whatever masked entries hold (even a NaN label turned into anything) does not matter
    targets2 = targets.clone()
    targets2[0, 2], targets2[1, 0] = 0.0, 1.0
    logits2 = logits.detach().clone()
    logits2[0, 2] = 50.0
    assert masked_bce(logits2, targets2, mask).item() == pytest.approx(loss.item(), rel=1e-6)


def test_all_masked_batch_gives_zero_with_a_gradient():
    logits = torch.tensor([[30.0, -30.0]], requires_grad=True)
    loss = masked_bce(logits, torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2))
    assert loss.item() == 0.0 and not math.isnan(loss.item()) and loss.grad_fn is not None
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros(1, 2))


def test_aux_ce_ignores_rows_with_unknown_values():
    torch.manual_seed(0)
    sex, view = torch.randn(4, 2, requires_grad=True), torch.randn(4, 3)
    aux = torch.tensor([[1, -1], [0, -1], [-1, -1], [1, -1]])
    mask = (aux >= 0).float()
    loss = aux_ce({"sex": sex, "view": view}, aux, mask, ["sex", "view"])
    expected = F.cross_entropy(sex[[0, 1, 3]], torch.tensor([1, 0, 1]))  # view: no known row → 0
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert torch.equal(sex.grad[2], torch.zeros(2))
    aux2 = torch.tensor([[1, 2], [0, -1], [-1, 0], [1, -1]])
    both = aux_ce({"sex": sex, "view": view}, aux2, (aux2 >= 0).float(), ["sex", "view"])
    view_ce = F.cross_entropy(view[[0, 2]], torch.tensor([2, 0]))
    assert both.item() == pytest.approx(expected.item() + view_ce.item(), rel=1e-6)


def test_aux_mean_averages_the_tasks_with_a_known_row():
    """``aux_reduction: mean``: the mean over tasks a batch has a known value of (a task no row knows —
    race at NIH — neither adds nor counts); ``sum``: the paper's Σ_k."""
    torch.manual_seed(1)
    logits = {"sex": torch.randn(4, 2), "age_bin": torch.randn(4, 5), "race": torch.randn(4, 5)}
    aux = torch.tensor([[1, 3, -1], [0, -1, -1], [-1, 2, -1], [1, 4, -1]])
    mask = (aux >= 0).float()
    tasks = ["sex", "age_bin", "race"]
    sex_ce = F.cross_entropy(logits["sex"][[0, 1, 3]], torch.tensor([1, 0, 1])).item()
    age_ce = F.cross_entropy(logits["age_bin"][[0, 2, 3]], torch.tensor([3, 2, 4])).item()
    assert aux_ce(logits, aux, mask, tasks, "sum").item() == pytest.approx(sex_ce + age_ce, rel=1e-6)
    assert aux_ce(logits, aux, mask, tasks).item() == pytest.approx(sex_ce + age_ce, rel=1e-6)  # sum: the default
    assert aux_ce(logits, aux, mask, tasks, "mean").item() == pytest.approx((sex_ce + age_ce) / 2, rel=1e-6)
    nothing = torch.full((4, 3), -1)
    assert aux_ce(logits, nothing, torch.zeros(4, 3), tasks, "mean").item() == 0.0
    with pytest.raises(ValueError, match="'median'"):
        aux_ce(logits, aux, mask, tasks, "median")
