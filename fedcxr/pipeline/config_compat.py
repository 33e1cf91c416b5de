"""Every former name of a config key, in one place (docs/methods.md; issue 29 item 7).

Configs written for earlier versions keep loading, and keep their fingerprint, so their runs resume:

* ``strategy`` is the former name of ``method``: accepted in the YAML (:data:`METHOD_KEYS`) and in
  ``--set`` (:func:`override_key`); ``cfg.strategy`` still reads it; the fingerprint hashes the
  method under this name (:func:`fingerprint_view`).
* Method options that were top-level keys moved under their method's own key
  (:data:`MOVED_KEYS`): an old key is mapped into its block with a deprecation warning naming the
  new key (:func:`upgrade`); the old and the new key together stop at load, naming the new one.
* Keys replaced by something else (:data:`RENAMED_KEYS`) stop at load with what to write instead.

Delete an entry here (with a changelog line) when its deprecation period ends; nothing else in
fedcxr knows these names.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from pydantic import AliasChoices

log = logging.getLogger(__name__)

#: The YAML keys of ``method`` (``strategy``: its former name, still accepted).
METHOD_KEYS = AliasChoices("method", "strategy")

#: ``--set`` keys that are another name of a key (``min_sites``: ``participation.min_sites``).
KEY_ALIASES = {"strategy": "method", "min_sites": "participation.min_sites"}

#: Keys of older configs that were replaced, with what to write instead (exit 2 naming it).
RENAMED_KEYS = {
    "head_warmup_rounds": "use `surgical: {head_warmup: {epochs: N, lr: 1e-3}}` (head-only local epochs before the "
                          "first round, the best-validation head kept, as the surgical aggregation code; epochs: 0 "
                          "turns it off)",
    "surgical_weighting": "use `backbone_weighting: uniform|samples` (it now applies to every method's "
                          "backbone average, not only FL_Surgical)",
}

#: Former top-level method options → where they live now: ``(method block, key in it)``. One former key
#: may feed several blocks (``server_lr`` was SCAFFOLD's η_g and FedOpt's η alike).
MOVED_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "fedprox_mu": (("fedprox", "mu"),),
    "server_lr": (("scaffold", "server_lr"), ("fedopt", "server_lr")),
    "server_betas": (("fedopt", "betas"),),
    "server_tau": (("fedopt", "tau"),),
    "beta": (("gp", "beta"),),
    "warmup_rounds": (("gp", "warmup_rounds"),),
    "post_warmup_lr_scale": (("gp", "post_warmup_lr_scale"),),
    "auto_alignment": (("gp", "auto_alignment"),),
    "finetune_offline_epochs": (("finetune_offline", "epochs"),),
    "head_warmup": (("surgical", "head_warmup"),),
}

#: Former keys the fingerprint left out when they held this value (their default then), so configs that
#: never set them kept the fingerprint of versions before them.
_DROPPED_WHEN = {"fedprox_mu": None, "server_lr": None, "server_betas": None, "server_tau": None,
                 "auto_alignment": "lr_s_over_lr_t"}

_WARNED: set[str] = set()


def new_keys(old: str) -> str:
    """``fedprox.mu`` (or ``scaffold.server_lr and fedopt.server_lr``) for a moved key."""
    return " and ".join(f"{block}.{key}" for block, key in MOVED_KEYS[old])


def upgrade(data: dict) -> dict:
    """A raw config mapping with every moved key put into its method block (a copy; ``data`` is kept).

    Raises ``ValueError`` (reported under the config's root) for a replaced key, for ``method`` and
    ``strategy`` together, and for an old key given beside its new one. :func:`written_as` says which
    former key a moved value came from (its errors name both)."""
    for old, new in RENAMED_KEYS.items():
        if old in data:
            raise ValueError(f"`{old}` was replaced: {new}")
    if "method" in data and "strategy" in data:
        raise ValueError("both `method` and `strategy` are given: they are one key (`strategy` is the former "
                         "name of `method`); keep `method`")
    moved = [old for old in MOVED_KEYS if old in data]
    if not moved:
        return data
    out = copy.copy(data)
    for old in moved:
        value = out.pop(old)
        for block, key in MOVED_KEYS[old]:
            target = out.get(block)
            if target is None:
                target = out[block] = {}
            elif not isinstance(target, dict):
                continue  # the block itself is wrong: its own check reports it
            else:
                target = out[block] = dict(target)
            if key in target:
                raise ValueError(f"`{old}` and `{block}.{key}` are both given: `{old}` is the former name of "
                                 f"`{block}.{key}`; keep `{block}: {{{key}: ...}}`")
            target[key] = copy.deepcopy(value)
            out.setdefault(_PROVENANCE, {})[f"{block}.{key}"] = old
        if old not in _WARNED:
            _WARNED.add(old)
            log.warning("config: `%s` is deprecated, it moved under its method's key: write `%s` (the old key "
                        "still loads, with the same fingerprint)", old, new_keys(old))
    return out


#: the key under which :func:`upgrade` notes where moved values came from (popped by :func:`written_as`)
_PROVENANCE = "__former_keys__"


def written_as(data: dict) -> dict[str, str]:
    """``{"fedopt.betas": "server_betas"}``: the former key of each value :func:`upgrade` moved (taken out
    of ``data``)."""
    return data.pop(_PROVENANCE, None) or {}


def override_key(key: str) -> str:
    """The key a ``--set KEY=...`` sets: ``strategy`` → ``method``, a moved key → its (first) new place
    (``--set warmup_rounds=0`` → ``gp.warmup_rounds``); a dotted key under a moved one follows it."""
    key = KEY_ALIASES.get(key, key)
    head, dot, rest = key.partition(".")
    if head in MOVED_KEYS and len(MOVED_KEYS[head]) == 1:
        block, new = MOVED_KEYS[head][0]
        return f"{block}.{new}{dot}{rest}"
    return key


def forget_former(data: dict, key: str) -> None:
    """Before ``--set KEY=...`` writes ``key``: a former name of that key in ``data`` is moved to its new
    place(s) first (``head_warmup: {...}`` → ``surgical.head_warmup``), so the override changes that value,
    whichever name the YAML used, and keeps the rest of it."""
    for alias, name in KEY_ALIASES.items():
        if key == name:
            data.pop(alias, None)
    for old, places in MOVED_KEYS.items():
        paths = [f"{block}.{name}" for block, name in places]
        if old not in data or not any(key == p or key.startswith(p + ".") for p in paths):
            continue
        value = data.pop(old)
        for block, name in places:
            if isinstance(data.get(block, {}), dict):
                data[block] = {**data.get(block, {})}
                data[block].setdefault(name, copy.deepcopy(value))


def fingerprint_view(data: dict, defaults: dict[str, dict]) -> dict:
    """The fingerprint's view of a dumped config: the former flat layout of the moved keys.

    ``data``: the config's ``model_dump(mode="json")`` with ``method`` already hashed under
    ``strategy``; ``defaults``: every method block's dump with its defaults. A moved key whose blocks
    agree is written back at its old place (and left out where the old fingerprint left it out);
    the rest of a built-in block, and a new method's block, is hashed only when it differs from its
    defaults — so adding a method, or an option, changes no existing fingerprint.
    """
    out = dict(data)
    blocks = {name: copy.deepcopy(out.pop(name)) for name in defaults if isinstance(out.get(name), dict)}
    for old, places in MOVED_KEYS.items():
        values = [blocks[b].get(k, defaults[b].get(k)) for b, k in places if b in blocks]
        if not values or any(v != values[0] for v in values):
            continue  # set apart in a new-style config: its blocks keep them
        for b, k in places:
            if b in blocks:
                blocks[b].pop(k, None)
        if not (old in _DROPPED_WHEN and values[0] == _DROPPED_WHEN[old]):
            out[old] = values[0]
    for name, block in blocks.items():
        rest = {k: v for k, v in block.items() if v != defaults[name].get(k)}
        if rest:
            out[name] = rest
    return out


__all__ = ["KEY_ALIASES", "METHOD_KEYS", "MOVED_KEYS", "RENAMED_KEYS", "fingerprint_view", "forget_former",
           "override_key", "upgrade"]
