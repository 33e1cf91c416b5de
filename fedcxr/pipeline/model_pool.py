"""One network for every simulated site of a process, and a fast way to load a state into it.

Why: the in-process simulator (and each ``engine.site_workers`` process) holds many
:class:`~fedcxr.pipeline.site_runner.SiteRunner` s. Each built its own network the first time it
trained, so a consortium of N sites built N networks in its first round (about 25 ms each for the
28 px ``resnet_tiny``, seconds for a DenseNet) and kept N networks' parameters in memory for the
whole run — while every task begins by loading the received model into the network anyway. A
:class:`ModelPool` holds one network per layout (head classes, auxiliary tasks) for all the runners
of a process; a task that loads every entry of the network (:func:`covers`) uses it, so the
network's previous contents (another site's model) cannot show through, and the result is the one
a network of the site's own would give, bit for bit. A task that would leave an entry as the
network had it (a partial load) gets the site's own network, as before.

:func:`load_state` copies a state into a network's tensors directly — what
``Module.load_state_dict`` does for a plain network (``tensor.copy_`` under ``no_grad``) without its
walk over every module, which cost as much as a small network's training step; a network with
load hooks, or a state it would reshape or refuse, goes through ``load_state_dict`` itself.
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterable, Mapping

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["ModelPool", "covers", "entry_names", "load_state"]


class ModelPool:
    """The networks shared by the site runners of one process, one per layout key.

    A runner asks :meth:`get` with its layout and a builder; the first asker's builder makes the
    network. Nothing of a site stays in it between tasks: every task that uses it loads all of
    its entries first (:func:`covers`).
    """

    def __init__(self) -> None:
        self._networks: dict[tuple, nn.Module] = {}

    def get(self, key: tuple, build: Callable[[], nn.Module]) -> nn.Module:
        if key not in self._networks:
            self._networks[key] = build()
        return self._networks[key]

    def __len__(self) -> int:
        return len(self._networks)


def covers(model: nn.Module, keys: Iterable[str], head_classes: Iterable[str], param_classes: Iterable[str]) -> bool:
    """Whether loading ``keys`` (the received entries plus the site's own local ones) sets every
    entry of ``model`` — and, where the received head has other classes, every row of its head.

    Only then may a shared network serve the task: nothing of its earlier contents survives."""
    given = set(keys)
    if any(name not in given for name in entry_names(model)):
        return False
    wanted = set(param_classes)
    return all(c in wanted for c in head_classes)


#: each network's state-dict entry names with the module layout they were read from (:func:`entry_names`)
_NAMES: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def entry_names(model: nn.Module) -> list[str]:
    """The names of ``model.state_dict()``'s entries, read once per network while its modules stay.

    Why: :func:`covers` runs for every task of every simulated site, and ``state_dict`` walks every
    module through its save hooks (~0.6 ms for resnet_tiny; the check below ~0.2 ms). The names are
    kept with the network's modules and their own parameter and buffer names; a network whose
    modules or entries changed since is read anew."""
    layout = tuple((id(m), tuple(m._parameters), tuple(m._buffers), tuple(m._non_persistent_buffers_set))
                   for m in model.modules())
    kept = _NAMES.get(model)
    if kept is None or kept[0] != layout:
        kept = (layout, list(model.state_dict(keep_vars=True)))
        _NAMES[model] = kept
    return kept[1]


#: :func:`_plain`'s answer per network (a network's modules do not change after it is built)
_PLAIN: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def _plain(model: nn.Module) -> bool:
    """No module with load hooks, extra state or a ``_load_from_state_dict`` of its own (BatchNorm's
    only fills in a missing ``num_batches_tracked``, which :func:`load_state` leaves as it is too)."""
    if model not in _PLAIN:
        _PLAIN[model] = _no_load_hooks(model)
    return _PLAIN[model]


def _no_load_hooks(model: nn.Module) -> bool:
    for module in model.modules():
        if module._load_state_dict_pre_hooks or module._load_state_dict_post_hooks:
            return False
        method = type(module)._load_from_state_dict
        if method is not nn.Module._load_from_state_dict and not isinstance(module, _BatchNorm):
            return False
        if type(module).set_extra_state is not nn.Module.set_extra_state:
            return False
    return True


def load_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """``model.load_state_dict(state, strict=False)``'s effect and its ``(missing, unexpected)``
    keys: each entry of ``state`` copied into the network's tensor of that name.

    Falls back to ``load_state_dict`` (same result, its own errors) for a network with load hooks
    and for an entry whose shape differs from the network's (it raises, naming it)."""
    targets = model.state_dict(keep_vars=True)
    if not _plain(model):
        result = model.load_state_dict(state, strict=False)
        return list(result.missing_keys), list(result.unexpected_keys)
    pairs = []
    for name, target in targets.items():
        if name in state:
            value = state[name]
            if not isinstance(value, torch.Tensor) or value.shape != target.shape:
                result = model.load_state_dict(state, strict=False)  # raises as before, naming the entry
                return list(result.missing_keys), list(result.unexpected_keys)
            pairs.append((target, value))
    with torch.no_grad():
        for target, value in pairs:
            target.copy_(value)
    missing = [name for name in targets if name not in state]
    unexpected = [name for name in state if name not in targets]
    return missing, unexpected
