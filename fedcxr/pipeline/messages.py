"""What travels between the server and a site: the typed task configs, the reply, the payload layouts (a leaf).

Nothing here imports the rest of fedcxr, so protocols, transports and site runners all point
down at this module and never at each other (STYLE: MONAI ``fl/utils/exchange_object``).

* Task configs (the "envelope" of every task): frozen dataclasses built by the protocols —
  :class:`TrainTask` (``train``: the settings every local training understands),
  :class:`EvaluateTask` (``evaluate``), :class:`ValidateTask` (FLARE's cross-site ``validate``)
  and :class:`NoConfig` (``metadata``, ``local_state``); :data:`TASK_CONFIGS` says which of the
  site runner's own tasks takes which. A method that sends more declares its share of the
  envelope in its own module: a :class:`TrainTask` subclass for a task of its own (docs/methods.md;
  e.g. FedProx's ``train_prox`` adds ``prox_mu``), so this module never grows with a method.
  On the wire a config is a flat dict of JSON values (:meth:`TaskConfig.to_dict`);
  :func:`parse_task_config` reads one back once — at the site runner and in FLARE's wire checks —
  refusing an unknown or a missing key, or a value of the wrong type, with
  :class:`TaskConfigError` naming the task and the key. Each config is also a read-only mapping
  of its keys (``task["lr"]``, ``dict(task)``), for code that records tasks as dicts.
* :class:`Reply` — what one site sends back for one task: parameters, counts, class names,
  metrics. Never images, labels or identifiers. Its ``weight_type`` says what the parameters
  are: :data:`WEIGHTS` (the site's model) or :data:`DELTAS` (differences from the model the task
  sent: FLARE's replies under ``privacy.filters``, turned back into weights by the wire checks).

The payload layouts of tasks whose parameters are more than one model (GP's ``train_combine``,
FACT's ``fact_target``, SCAFFOLD's ``train_scaffold``) live with their methods.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Iterator, Literal, Optional, Union

import torch

StateDict = dict[str, torch.Tensor]

#: ``Reply.weight_type``: the parameters are the site's model / differences from the model the task sent
#: (MONAI ``ExchangeObject.weight_type``'s WEIGHTS and WEIGHT_DIFF).
WEIGHTS, DELTAS = "weights", "deltas"
WEIGHT_TYPES = (WEIGHTS, DELTAS)


# --------------------------------------------------------------------------- task configs


class TaskConfigError(ValueError):
    """A task config that cannot be used: an unknown or missing key, or a value of the wrong type."""


class TaskConfig(Mapping):
    """Base of the typed task configs: a frozen dataclass, a flat dict of JSON values on the wire.

    Subclasses are ``@dataclass(frozen=True)``; :meth:`to_dict` / :meth:`from_dict` convert, and
    every config reads as a mapping of its keys (tuples where the wire has lists)."""

    #: the config's name in messages ("train task config: missing key 'lr'")
    kind: ClassVar[str] = "task"

    def to_dict(self) -> dict[str, Any]:
        """The wire form: every key, JSON values only (tuples as lists, nested configs as dicts)."""
        return {f.name: _to_wire(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Any) -> "TaskConfig":
        """Exactly the keys :meth:`to_dict` writes, each of its field's type; :class:`TaskConfigError` otherwise."""
        if type(data) is cls:  # a subclass (a method's task config) has keys this task does not take
            return data
        if not isinstance(data, Mapping):
            raise TaskConfigError(f"{cls.kind} config: expected a mapping of keys, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(str(k)[:60] for k in data if k not in names)
        missing = [n for n in names if n not in data]
        if unknown or missing:
            parts = ([f"unknown key(s) {unknown[:8]}"] if unknown else []) + \
                    ([f"missing key(s) {missing[:8]}"] if missing else [])
            raise TaskConfigError(f"{cls.kind} config: {'; '.join(parts)} (server and site must run the same "
                                  "fedcxr version)")
        hints = _hints(cls)
        return cls(**{n: _check(data[n], hints[n], f"{cls.kind} config: {n}") for n in names})

    @classmethod
    def build(cls, **values: Any) -> "TaskConfig":
        """The config of ``values`` (keys with a default may be left out), checked as :meth:`from_dict`:
        lists become tuples, a misspelt key or a value of the wrong type never travels."""
        defaults = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        return cls.from_dict({**defaults, **values})

    def replace(self, **changes: Any) -> "TaskConfig":
        """A copy with ``changes``, checked as :meth:`build`."""
        return self.build(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

    @classmethod
    def extend(cls, base: "TaskConfig", **values: Any) -> "TaskConfig":
        """This (sub)class's config from ``base``'s fields plus ``values``: a method's task config built on
        the common one (``ProxTask.extend(task_config(ctx, r, "source"), prox_mu=0.01)``)."""
        return cls.build(**{**{f.name: getattr(base, f.name) for f in fields(base)}, **values})

    # read-only mapping view
    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str) or key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _to_wire(value: Any) -> Any:
    if isinstance(value, TaskConfig):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


def _check(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the type ``hint`` names (the few types task configs use), or :class:`TaskConfigError`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: X's own message
            return _check(value, options[0], where)
        for option in options:
            try:
                return _check(value, option, where)
            except TaskConfigError:
                continue
        raise TaskConfigError(f"{where}: {_shown(value)} is not {' or '.join(_name(a) for a in args)}")
    if origin is Literal:
        if isinstance(value, str) and value in args:
            return value
        raise TaskConfigError(f"{where}: {_shown(value)} is not one of {list(args)}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise TaskConfigError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if hint is dict or origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise TaskConfigError(f"{where}: expected a mapping with string keys, got {type(value).__name__}")
        return dict(value)
    if isinstance(hint, type) and issubclass(hint, TaskConfig):
        return hint.from_dict(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - a field of a type this checker does not know is a programming error
        raise TypeError(f"{where}: no check for type {hint!r}")
    raise TaskConfigError(f"{where}: {_shown(value)} is not {_name(hint)}")


def _name(hint: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a finite number", str: "a string",
            type(None): "null"}.get(hint, getattr(hint, "__name__", str(hint)))


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class TrainTask(TaskConfig):
    """One site's local training of one round (``train``; a method's own training tasks take a subclass
    with their extra fields), built by :func:`fedcxr.pipeline.protocols.task_config`.

    Every random draw of the task comes from ``seed`` and ``round`` (with the site's name, the role
    and ``repeat``); ``param_classes`` is the head-row order of the params sent, ``head_classes``
    the head this site trains (surgical aggregation: its own classes).
    """

    kind: ClassVar[str] = "train task"

    round: int
    seed: int
    role: Literal["source", "target"]
    head_classes: tuple[str, ...]
    param_classes: tuple[str, ...]
    lr: float
    batch_size: int
    epochs: int = 1
    steps: Optional[int] = None  # optimiser steps; overrides epochs
    aux_tasks: tuple[str, ...] = ()
    alpha: float = 1.0  # weight of the aux losses
    aux_reduction: Literal["sum", "mean"] = "sum"  # Σ_k or mean over the aux tasks (losses.aux_ce)
    use_aux: bool = False
    weight_decay: float = 0.0
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    momentum: float = 0.9  # SGD only
    keep_optimizer: bool = False  # continue this site's optimiser state of earlier rounds
    max_rows: Optional[int] = None
    trainable: Literal["all", "head", "backbone"] = "all"
    local_keys: tuple[str, ...] = ()  # entries kept at the site (FedBN: BN; PFL: the head)
    missing_as_negative: bool = False  # Vanilla FL / Central: an unlabeled class is a negative
    freeze_bn: bool = False  # FedBN+: BatchNorm frozen in eval mode
    labeled: Optional[Union[int, float]] = None  # target: a count of labeled rows or a fraction
    label_draw: Optional[int] = None  # target: which rows the cap keeps (None: the fixed draw; labeled_rows)
    holdout_folds: int = 0  # target, cross-fitting: ≥ 2 folds of the labeled rows' patients (0: none) ...
    holdout_fold: int = 0  # ... and this fold is held out of training (fedcxr.pipeline.labeled_rows)
    dp: Optional[dict] = None  # privacy.dp (noise_multiplier, max_grad_norm, delta)


@dataclass(frozen=True)
class EvaluateTask(TaskConfig):
    """Per-class AUROC of the received model on one of the site's splits (the rounds' validation)."""

    kind: ClassVar[str] = "evaluate task"

    head_classes: tuple[str, ...]
    param_classes: tuple[str, ...]
    aux_tasks: tuple[str, ...] = ()
    split: str = "val"
    local_keys: tuple[str, ...] = ()
    batch_size: int = 64


@dataclass(frozen=True)
class ValidateTask(TaskConfig):
    """FLARE's cross-site evaluation: the site scores the model on its ``split`` and answers with summaries."""

    kind: ClassVar[str] = "validate task"

    classes: tuple[str, ...]
    aux_tasks: tuple[str, ...] = ()
    split: str = "test"
    n_boot: int = 1000
    seed: int = 0
    model_owner: str = ""  # FLARE's name of whose model this is (the server's, or the site's own)


@dataclass(frozen=True)
class NoConfig(TaskConfig):
    """The config of a task that takes none (``metadata``, ``local_state``)."""

    kind: ClassVar[str] = "task"


#: The config of every task a site runner answers by itself (a method's own tasks declare theirs:
#: :class:`~fedcxr.pipeline.site_runner.SiteTask` ``config``).
TASK_CONFIGS: dict[str, type[TaskConfig]] = {
    "metadata": NoConfig, "train": TrainTask, "evaluate": EvaluateTask, "validate": ValidateTask,
    "local_state": NoConfig,
}


def parse_task_config(task: str, config: Any, configs: Optional[Mapping[str, type]] = None) -> TaskConfig:
    """``config`` as the typed config of ``task`` (a config of the right type passes as it is; ``None``
    is an empty config); :class:`TaskConfigError` names the task and the key at fault.

    ``configs``: task → config type of the tasks the caller knows (default :data:`TASK_CONFIGS`)."""
    configs = TASK_CONFIGS if configs is None else configs
    if task not in configs:
        raise TaskConfigError(f"unknown task {str(task)[:60]!r} (known: {sorted(configs)})")
    kind = configs[task]
    if type(config) is kind:
        return config
    try:
        return kind.from_dict({} if config is None else config)
    except TaskConfigError as exc:
        raise TaskConfigError(f"task {task!r}: {exc}") from None


# --------------------------------------------------------------------------- replies


@dataclass
class Reply:
    """What one site sends back for one task (``weight_type``: see :data:`WEIGHTS`, :data:`DELTAS`)."""

    site: str
    params: Optional[StateDict] = None
    n_samples: int = 0
    n_batches: int = 0
    class_set: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    weight_type: str = WEIGHTS
