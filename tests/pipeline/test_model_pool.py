"""The shared network's bookkeeping (fedcxr.pipeline.model_pool): entry names read once per network."""

from __future__ import annotations

import torch

from fedcxr.models.network import network_from_config
from fedcxr.pipeline import model_pool as P
from fedcxr.vocab import CLASSES


def _net():
    return network_from_config(list(CLASSES)[:2], {"backbone": "resnet_tiny", "hidden": 16}, {})


def test_entry_names_are_the_state_dicts_read_once_and_anew_when_the_modules_change(monkeypatch):
    """Issue 31 item 4: :func:`covers` runs for every task of every simulated site; the names are
    the state dict's, walked once per network — and again after a module is replaced."""
    net = _net()
    names = list(net.state_dict())
    assert P.entry_names(net) == names
    calls = []
    original = torch.nn.Module.state_dict

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "state_dict", counted)
    assert P.covers(net, names, net.classes, net.classes) and not P.covers(net, names[1:], net.classes, net.classes)
    assert not calls  # no walk through state_dict for a network already read
    net.head = torch.nn.Linear(net.head.in_features, 3, bias=False)
    assert "head.bias" not in P.entry_names(net) and calls  # read anew
    monkeypatch.undo()
    assert P.entry_names(net) == list(net.state_dict())
