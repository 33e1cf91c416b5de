"""FACT's inter-domain distance (fedcxr.pipeline.aggregate.fact)."""

from __future__ import annotations

import pytest
import torch

from fedcxr.pipeline import aggregate as A


def test_idd_is_the_mean_absolute_difference_and_differentiable():
    a = torch.tensor([[0.2, 0.9], [0.5, 0.5]], requires_grad=True)
    b = torch.tensor([[0.4, 0.6], [0.5, 1.0]])
    value = A.idd(a, b)
    assert value.dim() == 0
    torch.testing.assert_close(value, torch.tensor(0.25))  # (0.2 + 0.3 + 0 + 0.5) / 4
    value.backward()
    torch.testing.assert_close(a.grad, torch.tensor([[-0.25, 0.25], [0.0, -0.25]]))
    assert float(A.idd(b, b)) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        A.idd(torch.zeros(2, 3), torch.zeros(3, 2))
