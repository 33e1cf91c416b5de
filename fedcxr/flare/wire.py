"""What travels between the FLARE server and a hospital, and how it is checked (DESIGN §8).

Both directions carry an ``FLModel``: ``params`` (a flat dict of numpy arrays) and ``meta``
(plain JSON-like values). This module turns a task or a :class:`Reply` into those two parts
and back, so the server (:mod:`fedcxr.flare.controller`) and the client script
(:mod:`fedcxr.flare.client`) agree on one format, and it refuses anything a site
should never send.

Layout (``meta["fedcxr"]`` holds our part; FLARE may add its own keys beside it; ``version``
:data:`WIRE_VERSION` in every block)::

    task  params: {"p/<state key>": array}
          meta:   {"kind": "task", "task", "config", "runner", "run", "reply_weight_type", "seal"}
    reply params: {"p/<state key>": array, "d/<state key>": array, "x/<extra key>": array}
          meta:   {"kind": "reply", "has_params", "weight_type", "n_samples", "n_batches", "class_set",
                   "metrics", "keys"}
    error meta:   {"kind": "error", "error": "<exception type name>"}   (no message: it could quote a path)

A task's ``config`` is its typed config's wire form (:mod:`fedcxr.pipeline.messages`); the site
reads it back with :func:`~fedcxr.pipeline.messages.parse_task_config`, so a task with an unknown
or a missing key, or a value of the wrong type, is refused (:func:`decode_task`) before any
training. Version 2: typed configs and explicit weight types (version 1 sent untyped configs
and a ``diff`` flag). Version 3: ``seal`` — a site of version 2 would answer a task that asks for
a sealed reply in the clear, so it refuses the task instead. Version 4: a method's own tasks
(``train_prox``, ``train_scaffold``, ``train_gp``, ...) with the config types their modules declare;
``train`` no longer carries method fields (``prox_mu``, ``combine``, ...) — a site of version 3
would refuse the new tasks as unknown, and answer an old server's method fields wrongly.

A task whose ``seal`` is ``he`` (``privacy.secure_aggregation``) is answered with every model
sealed (:mod:`fedcxr.flare.sealing`): its ``p/`` entries are then only ``sealed.<block>.data`` and
``sealed.<block>.layout`` (uint8), no extra tensors; :func:`decode_reply` with ``sealed=True``
refuses a reply holding anything else. Sealed entries in a task's params are opened by the site
(:mod:`fedcxr.flare.client`); the wire carries them as any uint8 array.

A task whose ``reply_weight_type`` is ``deltas`` (the experiment has ``privacy.filters``) is
answered with a reply of ``weight_type`` ``deltas``: ``d/<key>`` = the site's value − the value it
received, for every floating entry of the same shape (others stay ``p/``), and ``keys`` lists
every entry the site produced. FLARE's result filters (:mod:`fedcxr.flare.job`) then act on
updates, as NVFLARE's ``PercentilePrivacy`` expects; an entry a filter removed (``ExcludeVars``)
comes back as the received value — a zero update — and is named in the reply's
``metrics["excluded"]``. :func:`decode_reply` turns it back into weights: the protocols always
see ``weight_type`` ``weights``.

Tensors go as numpy arrays (FLARE's serializer carries them natively, large ones streamed);
no pickled objects, no strings in ``params``. A reply is accepted only if its counts are
non-negative integers, its class set is a list of class names, its metrics are JSON-like
scalars/dicts/lists, and every floating array is finite (the shared check of
:func:`fedcxr.pipeline.state.check_update`). Shapes are the protocol's business: it knows
what it sent (a surgical head has the site's classes, not the global ones).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

import numpy as np
import torch

from fedcxr.pipeline.messages import (
    DELTAS,
    TASK_CONFIGS,
    WEIGHT_TYPES,
    WEIGHTS,
    Reply,
    StateDict,
    TaskConfig,
    TaskConfigError,
    parse_task_config,
)
from fedcxr.pipeline.keys import SEALED_PREFIX
from fedcxr.pipeline.screening import describe_number
from fedcxr.pipeline.state import check_update

META_KEY = "fedcxr"
WIRE_VERSION = 4
#: ``seal`` values of a task: None (plain replies) or the mode of ``privacy.secure_aggregation``
SEALS = (None, "he")
PARAM_PREFIX = "p/"
DIFF_PREFIX = "d/"
EXTRA_PREFIX = "x/"
#: keys a reply's meta may hold (anything else is refused: nothing leaves a site unchecked)
REPLY_KEYS = frozenset({"version", "kind", "has_params", "weight_type", "n_samples", "n_batches", "class_set",
                        "metrics", "error", "keys"})


class WireError(ValueError):
    """A payload that must not be used; the message is the logged reason."""


# --------------------------------------------------------------------------- tensors


def to_numpy(state: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, np.ndarray]:
    """State dict → ``{prefix + key: ndarray}`` (CPU copies; dtype and shape kept)."""
    out = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise WireError(f"entry {key!r} is a {type(value).__name__}, not a tensor")
        if value.dtype == torch.bfloat16:
            raise WireError(f"entry {key!r} is bfloat16, which numpy cannot carry; cast to float32 first")
        out[prefix + key] = value.detach().cpu().contiguous().numpy().copy()
    return out


def to_torch(arrays: Mapping[str, Any], prefix: str) -> StateDict:
    """``{prefix + key: ndarray}`` → state dict of the entries with that prefix (writable copies)."""
    out = {}
    for name, value in arrays.items():
        if not name.startswith(prefix):
            continue
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise WireError(f"entry {name[len(prefix):]!r} has dtype {array.dtype}, not a number array")
        out[name[len(prefix):]] = torch.from_numpy(np.array(array, copy=True))
    return out


def _finite_problem(state: StateDict, what: str) -> Optional[str]:
    reason = check_update(state, state)  # same keys → only the NaN/Inf part can fail
    return f"{what}: {reason}" if reason else None


# --------------------------------------------------------------------------- server → site


def encode_task(task: str, params: Optional[StateDict], config: Optional[TaskConfig], *, runner: dict,
                run: str, reply_weight_type: str = WEIGHTS, seal: Optional[str] = None) -> tuple[dict, dict]:
    """(params, meta) of one task; ``runner`` = site settings from the experiment, ``run`` = its fingerprint.

    ``config``: the task's typed config (``None``: a task without one), checked against the task
    before it leaves; ``reply_weight_type`` ``deltas``: ask for the reply as differences from
    ``params`` (see the module docstring); ``seal`` ``he``: ask for every model in the reply sealed.
    """
    if seal not in SEALS:
        raise ValueError(f"seal must be one of {SEALS}, got {seal!r}")
    if reply_weight_type not in WEIGHT_TYPES:
        raise ValueError(f"reply_weight_type must be one of {WEIGHT_TYPES}, got {reply_weight_type!r}")
    try:  # a method's task config is typed by its module (the protocol built it): it travels as it is
        typed = config if isinstance(config, TaskConfig) and task not in TASK_CONFIGS else \
            parse_task_config(task, config)
    except TaskConfigError as exc:  # the server's own bug: never sent
        raise ValueError(str(exc)) from None
    arrays = to_numpy(params, PARAM_PREFIX) if params is not None else {}
    meta = {META_KEY: {"version": WIRE_VERSION, "kind": "task", "task": task, "has_params": params is not None,
                       "config": typed.to_dict(), "runner": dict(runner), "run": run,
                       "reply_weight_type": reply_weight_type, "seal": seal}}
    return arrays, meta


def decode_task(params: Optional[Mapping[str, Any]], meta: Optional[Mapping[str, Any]]) -> dict:
    """``{"task", "params", "config", "runner", "run", "reply_weight_type", "seal"}`` from a received task;
    ``config`` is the task's typed config, parsed here (:class:`WireError` naming the key at fault) for the
    tasks every site runner answers; a method's task config (a mapping of JSON values here) is parsed by
    the runner with the type its method declares, before any work."""
    body = (meta or {}).get(META_KEY)
    if not isinstance(body, dict) or body.get("kind") != "task":
        raise WireError("not a fedcxr task (no 'fedcxr' task block in the meta)")
    if body.get("version") != WIRE_VERSION:
        raise WireError(f"task format version {body.get('version')} (this site speaks {WIRE_VERSION}); "
                        "install the same fedcxr version on the server and the sites")
    task = body.get("task")
    if not isinstance(task, str):
        raise WireError("the task has no name")
    config = body.get("config")
    try:
        if task in TASK_CONFIGS:
            config = parse_task_config(task, config)
        elif not isinstance(config, Mapping):
            raise TaskConfigError(f"task {task[:60]!r}: expected a mapping of keys, got {type(config).__name__}")
    except TaskConfigError as exc:
        raise WireError(str(exc)) from None
    weight_type = body.get("reply_weight_type", WEIGHTS)
    if weight_type not in WEIGHT_TYPES:
        raise WireError(f"reply_weight_type {str(weight_type)[:40]!r} is not one of {list(WEIGHT_TYPES)}")
    seal = body.get("seal")
    if seal not in SEALS:
        raise WireError(f"seal {str(seal)[:40]!r} is not one of {list(SEALS)}")
    if seal is not None and weight_type != WEIGHTS:
        raise WireError("a task asking for a sealed reply asks for differences too")
    state = to_torch(params or {}, PARAM_PREFIX) if body.get("has_params") else None
    return {"task": task, "params": state, "config": config, "runner": dict(body.get("runner") or {}),
            "run": str(body.get("run") or ""), "reply_weight_type": weight_type, "seal": seal}


# --------------------------------------------------------------------------- site → server


def encode_reply(reply: Reply, reference: Optional[StateDict] = None) -> tuple[dict, dict]:
    """(params, meta) of a reply: parameters, extra tensors, counts, class names and metrics only.

    ``reference`` (the params the task carried, when it asked for ``deltas``): the reply goes with
    ``weight_type`` ``deltas``: floating entries of the same shape as ``d/`` differences from it, and
    ``keys`` names every entry.
    """
    arrays = {}
    if reply.params is not None:
        if reference is None:
            arrays = to_numpy(reply.params, PARAM_PREFIX)
        else:
            diffs = {k: v - reference[k] for k, v in reply.params.items() if _diffable(v, reference.get(k))}
            arrays = to_numpy(diffs, DIFF_PREFIX)
            arrays.update(to_numpy({k: v for k, v in reply.params.items() if k not in diffs}, PARAM_PREFIX))
    arrays.update(to_numpy(reply.extra or {}, EXTRA_PREFIX))
    deltas = reference is not None and reply.params is not None
    body = {
        "version": WIRE_VERSION, "kind": "reply", "has_params": reply.params is not None,
        "weight_type": DELTAS if deltas else WEIGHTS,
        "n_samples": int(reply.n_samples), "n_batches": int(reply.n_batches),
        "class_set": [str(c) for c in reply.class_set], "metrics": plain(reply.metrics),
    }
    if deltas:
        body["keys"] = list(reply.params)
    return arrays, {META_KEY: body}


def _diffable(value: torch.Tensor, ref: Optional[torch.Tensor]) -> bool:
    return (ref is not None and value.is_floating_point() and ref.is_floating_point()
            and tuple(value.shape) == tuple(ref.shape))


def encode_error(exc: BaseException) -> tuple[dict, dict]:
    """A reply saying the task failed; only the exception type leaves the site (logs keep the rest)."""
    return {}, {META_KEY: {"version": WIRE_VERSION, "kind": "error", "error": type(exc).__name__}}


def decode_reply(site: str, params: Optional[Mapping[str, Any]], meta: Optional[Mapping[str, Any]],
                 reference: Optional[StateDict] = None, task: Optional[str] = None, sealed: bool = False) -> Reply:
    """The :class:`Reply` of ``site``; :class:`WireError` (the reason) when it must not be used.

    ``reference``: the params the task sent, needed for a reply of ``weight_type`` ``deltas``, which
    comes back as the weights it describes (``weight_type`` ``weights``).
    ``task`` ``validate`` (cross-site evaluation): the reply must be a summary — no tensors,
    metrics passing :func:`check_summary`. ``sealed``: the task asked for a sealed reply; parameters in
    the clear or extra tensors are refused (the server does not use what it should never have seen).
    """
    body = (meta or {}).get(META_KEY)
    if not isinstance(body, dict):
        raise WireError("no 'fedcxr' block in the reply meta (not a fedcxr client?)")
    if body.get("kind") == "error":
        raise WireError(f"the site failed the task ({body.get('error', 'error')}; details in the site's own log)")
    if body.get("kind") != "reply" or body.get("version") != WIRE_VERSION:
        raise WireError(f"unknown reply format (kind {body.get('kind')!r}, version {body.get('version')!r})")
    unknown = sorted(set(body) - REPLY_KEYS)
    if unknown:
        raise WireError(f"unexpected reply fields {unknown}")
    n_samples, n_batches = _count(body, "n_samples"), _count(body, "n_batches")
    class_set = body.get("class_set", [])
    if not isinstance(class_set, list) or not all(isinstance(c, str) for c in class_set):
        raise WireError("class_set is not a list of class names")
    metrics = body.get("metrics", {})
    if not isinstance(metrics, dict) or not _is_plain(metrics):
        raise WireError("metrics hold something other than numbers, strings, lists and dicts")
    arrays = dict(params or {})
    stray = sorted(k for k in arrays if not k.startswith((PARAM_PREFIX, DIFF_PREFIX, EXTRA_PREFIX)))
    if stray:
        raise WireError(f"unexpected parameter entries {stray[:5]}")
    if task in SUMMARY_TASKS:
        if arrays or body.get("has_params"):
            raise WireError(f"a {task} reply carries tensors; it may hold summaries only")
        check_summary(metrics)
    weight_type = body.get("weight_type", WEIGHTS)
    if weight_type not in WEIGHT_TYPES:
        raise WireError(f"weight_type {str(weight_type)[:40]!r} is not one of {list(WEIGHT_TYPES)}")
    if weight_type == WEIGHTS and (any(k.startswith(DIFF_PREFIX) for k in arrays) or "keys" in body):
        raise WireError("a reply of weight_type weights carries difference entries or a key list")
    state = to_torch(arrays, PARAM_PREFIX) if body.get("has_params") else None
    if state is None and any(k.startswith(DIFF_PREFIX) for k in arrays):
        raise WireError("difference entries in a reply without parameters")
    if state is not None and weight_type == DELTAS:
        state, excluded = _undiff(state, to_torch(arrays, DIFF_PREFIX), body.get("keys"), reference)
        if excluded:
            metrics = {**metrics, "excluded": excluded}
    extra = to_torch(arrays, EXTRA_PREFIX)
    _check_sealing(state, extra, sealed)
    for part, what in ((state, "parameters"), (extra, "extra tensors")):
        problem = _finite_problem(part, what) if part else None
        if problem:
            raise WireError(problem)
    return Reply(site=site, params=state, n_samples=n_samples, n_batches=n_batches,
                 class_set=list(class_set), metrics=metrics, extra=extra)


def _check_sealing(state: Optional[StateDict], extra: StateDict, sealed: bool) -> None:
    """A reply to a sealed task holds sealed entries only; a reply to a plain task none."""
    keys = list(state or {})
    in_clear = [k for k in keys if not k.startswith(SEALED_PREFIX)]
    if sealed and (in_clear or extra):
        what = in_clear[:3] if in_clear else [EXTRA_PREFIX + k for k in list(extra)[:3]]
        raise WireError(f"the site sent {what} in the clear in reply to a task asking for sealed models "
                        "(privacy.secure_aggregation); the reply is not used")
    if not sealed and len(in_clear) != len(keys):
        raise WireError("a sealed reply to a task that asked for a plain one")


def _undiff(full: StateDict, diffs: StateDict, keys: Any, reference: Optional[StateDict]) -> tuple[StateDict, list]:
    """Received value + difference per ``d/`` entry; an entry named in ``keys`` but removed by a
    filter comes back as the received value (a zero update) and is returned in ``excluded``."""
    if reference is None:
        raise WireError("a reply of differences to a task that sent no parameters")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise WireError("a reply of differences needs 'keys', the list of its entries")
    state, excluded = {}, []
    for key in keys:
        if key in diffs:
            if key not in reference or tuple(reference[key].shape) != tuple(diffs[key].shape):
                raise WireError(f"difference entry {key!r} does not match the parameters sent")
            state[key] = reference[key] + diffs[key].to(reference[key].dtype)
        elif key in full:
            state[key] = _as_sent(full[key], reference.get(key))
        elif key in reference:
            state[key] = reference[key].clone()
            excluded.append(key)
        else:
            raise WireError(f"entry {key!r} is missing from the reply and was not sent")
    unlisted = sorted((set(full) | set(diffs)) - set(keys))
    if unlisted:
        raise WireError(f"entries {unlisted[:5]} are not among the reply's keys")
    return state, excluded


def _as_sent(value: torch.Tensor, ref: Optional[torch.Tensor]) -> torch.Tensor:
    """An entry in the dtype it was sent in: NVFLARE's PercentilePrivacy returns a 0-dim integer
    (BatchNorm's ``num_batches_tracked``) as a float."""
    if ref is None or value.dtype == ref.dtype or tuple(value.shape) != tuple(ref.shape):
        return value
    if not ref.is_floating_point() and value.is_floating_point():
        return torch.round(value).to(ref.dtype)
    return value.to(ref.dtype)


def _count(body: dict, key: str) -> int:
    """A non-negative integer; whether it is plausible (at most what the site reported at the start
    of the run) is the protocols' check (:mod:`fedcxr.pipeline.screening`), the same in-process."""
    value = body.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise WireError(f"{key} is {describe_number(value)}, not a non-negative integer")  # never an unbounded repr
    return int(value)


# --------------------------------------------------------------------------- JSON-like values


def plain(value: Any) -> Any:
    """Metrics as plain Python (numpy/torch scalars → float/int; tuples → lists)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _is_plain(value: Any, depth: int = 0) -> bool:
    if depth > 8:
        return False
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return True  # NaN allowed: an undefined AUROC is reported as NaN
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_plain(v, depth + 1) for v in value)
    return False


# --------------------------------------------------------------------------- evaluation summaries

#: tasks whose reply is an evaluation summary (:func:`check_summary`), never tensors
SUMMARY_TASKS = frozenset({"validate"})
#: keys that name rows, patients, images or per-row outputs: never in a summary
FORBIDDEN_KEYS = frozenset({"row_key", "patient_key", "patient_id", "study_id", "image_path", "path", "paths",
                            "index", "indices", "probs", "predictions", "labels", "label_mask", "ids"})
FORBIDDEN_PREFIXES = ("prob__", "label__", "aux__")
#: longest list in a summary: classes (22), subgroups, calibration bins — a per-image vector is longer
MAX_SUMMARY_LIST = 64
MAX_SUMMARY_STRING = 200
_HEX_RUN = re.compile(r"[0-9a-fA-F]{16,}")  # row/patient keys and content hashes are long hex strings


def check_summary(value: Any, where: str = "metrics") -> None:
    """Refuse a summary that could carry predictions, ids or paths (:class:`WireError` names where).

    Summaries are numbers, short strings and small dicts/lists: no key naming rows, patients,
    images or per-row outputs; no string with a path separator or a long hex run (a hashed key);
    no list longer than :data:`MAX_SUMMARY_LIST` (a per-image vector).
    """
    if isinstance(value, dict):
        for key, item in value.items():
            name = str(key)
            if name.lower() in FORBIDDEN_KEYS or name.startswith(FORBIDDEN_PREFIXES):
                raise WireError(f"{where}: key {name!r} is not allowed in an evaluation summary")
            _check_summary_string(name, f"{where} key")
            check_summary(item, f"{where}.{name}")
    elif isinstance(value, (list, tuple)):
        if len(value) > MAX_SUMMARY_LIST:
            raise WireError(f"{where}: a list of {len(value)} values (at most {MAX_SUMMARY_LIST} in a summary: "
                            "per-image values never leave a site)")
        for i, item in enumerate(value):
            check_summary(item, f"{where}[{i}]")
    elif isinstance(value, str):
        _check_summary_string(value, where)
    elif value is not None and not isinstance(value, (bool, int, float, np.integer, np.floating)):
        raise WireError(f"{where}: a {type(value).__name__} is not allowed in an evaluation summary")


def _check_summary_string(text: str, where: str) -> None:
    if len(text) > MAX_SUMMARY_STRING:
        raise WireError(f"{where}: a string of {len(text)} characters (at most {MAX_SUMMARY_STRING})")
    if "/" in text or "\\" in text:
        raise WireError(f"{where}: {text[:40]!r} looks like a path")
    if _HEX_RUN.search(text):
        raise WireError(f"{where}: {text[:40]!r} holds a long hex string (a hashed id?)")
