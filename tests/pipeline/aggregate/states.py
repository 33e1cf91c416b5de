"""Small state dicts and exact comparisons shared by the aggregation rules' tests."""

from __future__ import annotations

import torch
from torch import nn


def clone(state):
    return {k: v.clone() for k, v in state.items()}


def assert_same(a, b):
    """Same keys, dtypes and exactly equal values."""
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def assert_close(a, b, **tol):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        torch.testing.assert_close(a[k], b[k], **tol)


def t(*values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def unit_scales(n):
    """GP keyword arguments giving every source scale s_i = (n_T/bs_T)·bs_S/Σn = 1 (Σn = 1)."""
    return dict(n_sources=[1.0 / n] * n, n_target=1, bs_source=1, bs_target=1, lr_source=1, lr_target=1)


def tiny_state(seed, scale=1.0):
    """A conv + BN + linear state dict with running stats and num_batches_tracked."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 2))
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    state["1.running_mean"] = torch.randn(3) * scale
    state["1.running_var"] = torch.rand(3) + 0.5
    state["1.num_batches_tracked"] = torch.tensor(seed, dtype=torch.long)
    return state


def perturbed(state, seed, size=0.1):
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in state.items():
        if v.is_floating_point():
            out[k] = v + size * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        else:
            out[k] = v + 7
    return out
