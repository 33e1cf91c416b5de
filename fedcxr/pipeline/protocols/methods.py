"""Every method fedcxr runs, derived from the method modules: the one registry (docs/methods.md).

Each module of this package that defines ``METHODS`` (``{"FedProx": method(FedProxProtocol, ...)}``)
contributes its names; nothing is listed by hand here, so a new method is a new module and nothing
else. A method outside fedcxr is named by a reference, ``path/to/file.py:Name`` or
``package.module:Name`` (:func:`resolve`): ``Name`` is a key of that module's ``METHODS`` table or a
:class:`~fedcxr.pipeline.protocols.base.RoundProtocol` subclass.

What the rest of fedcxr needs about methods is derived here from the protocol classes:

* :data:`METHODS` — built-in name → :class:`~fedcxr.pipeline.protocols.spec.Method` (config
  validation, ``fedcxr sweep``, the README's table is checked against it);
* :func:`option_models` — config key → options model, for the config's method blocks;
* :func:`site_tasks` — the tasks a site answers beyond its runner's own (``SiteRunner(tasks=...)``),
  with their config types, state and streaming flags (FLARE filters and tracking derive from them);
* :func:`resolve` / :func:`method_name` — a config's ``method`` value → its recipe and its name.

The config imports this module when it validates a ``method`` (the method modules import nothing of
the config), so the table is built on first use, not at import.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Iterator, Optional

from fedcxr.errors import UserError
from fedcxr.pipeline.protocols.spec import Method, MethodOptions, SiteTask

#: The method every config runs unless it says (``method:``).
DEFAULT_METHOD = "FedAvg"

#: The methods ``fedcxr demo`` compares (:mod:`fedcxr.workflows.demo`), each with what it means to a hospital,
#: in its table's order: the first is the baseline the others are tested against, the second the method the
#: demo's ``demo.yaml`` names. Here, not in the demo: method names live in the protocols package (DESIGN §1).
DEMO_METHODS = (
    ("Target_Only", "the hospital alone"),
    ("FedAvg_Finetune", "federated (FedAvg), then fine-tuned"),
    ("FedAvg_Finetune_AuxInfo_GP", "the papers' method (AuxInfo + GP)"),
)

#: Tasks every site runner answers by itself (:data:`fedcxr.pipeline.site_runner.TASKS`): no method may take these names.
RUNNER_TASKS = ("metadata", "train", "evaluate", "validate", "local_state")


class _Registry(Mapping):
    """The built-in methods, discovered in this package on first use (name → :class:`Method`)."""

    def __init__(self) -> None:
        self._table: Optional[dict[str, Method]] = None

    def _load(self) -> dict[str, Method]:
        if self._table is None:
            self._table = _discover()
        return self._table

    def __getitem__(self, name: str) -> Method:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def __contains__(self, name: object) -> bool:
        return name in self._load()


#: Every built-in method: name → :class:`~fedcxr.pipeline.protocols.spec.Method` (from the modules' ``METHODS``).
METHODS: Mapping[str, Method] = _Registry()


def _discover() -> dict[str, Method]:
    """The ``METHODS`` tables of this package's modules, in module order; a name twice is a bug."""
    package = sys.modules[__name__.rpartition(".")[0]]
    found: dict[str, Method] = {}
    owner: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        name = f"{package.__name__}.{info.name}"
        if name == __name__:
            continue
        table = getattr(importlib.import_module(name), "METHODS", None)
        if not isinstance(table, Mapping):
            continue
        for method_name, spec in table.items():
            if method_name in found:  # pragma: no cover - two modules claiming a name is a programming error
                raise RuntimeError(f"method {method_name!r} is declared by {owner[method_name]} and {name}")
            found[method_name], owner[method_name] = spec, name
    _check_classes([spec.protocol for spec in found.values()], "fedcxr")
    # the default method's module first (listings start with FedAvg), then module by module
    first = [n for n in found if owner[n] == owner.get(DEFAULT_METHOD)]
    return {n: found[n] for n in [*first, *(n for n in found if n not in first)]}


def unknown_method(name: object) -> str:
    """The message for a method name that is not in :data:`METHODS` (listing the known ones); the
    name is user input: shown bounded."""
    from fedcxr.suggest import did_you_mean

    shown = repr(name) if isinstance(name, str) else f"of type {type(name).__name__}"
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return (f"unknown method {shown}{did_you_mean(name, METHODS)}; known: {', '.join(METHODS)} (or a method of your "
            "own: path/to/file.py:Name)")


# --------------------------------------------------------------------------- references


def is_reference(value: str) -> bool:
    """``file.py:Name`` or ``package.module:Name`` (a method outside fedcxr), not a built-in name."""
    return isinstance(value, str) and ":" in value


def method_name(value: str) -> str:
    """The method's name of a config's ``method`` value: itself, or the ``Name`` of a reference."""
    return value.rpartition(":")[2] if is_reference(value) else value


def resolve(value: str) -> Method:
    """The recipe of a built-in name or of a reference (the reference's module is executed:
    SECURITY.md, "Methods from files"); :class:`UserError` saying why not."""
    if not isinstance(value, str) or not is_reference(value):
        if isinstance(value, str) and value in METHODS:
            return METHODS[value]
        raise UserError(unknown_method(value))
    source, _, name = value.rpartition(":")
    module = load_module(source)
    return method_in(module, name, value)


def method_in(module, name: str, reference: str) -> Method:
    """``name`` of ``module``: an entry of its ``METHODS`` table or a RoundProtocol subclass."""
    from fedcxr.pipeline.protocols.base import RoundProtocol

    table = getattr(module, "METHODS", None)
    if isinstance(table, Mapping) and name in table:
        spec = table[name]
        if not isinstance(spec, Method):
            raise UserError(f"method {reference}: METHODS[{name!r}] is not a method(ProtocolClass, ...) entry")
    else:
        found = getattr(module, name, None)
        if not (isinstance(found, type) and issubclass(found, RoundProtocol)):
            known = sorted(table) if isinstance(table, Mapping) else []
            raise UserError(f"method {reference}: {name!r} is neither a key of the module's METHODS table "
                            f"({known or 'none'}) nor a RoundProtocol subclass in it")
        spec = Method(found)
    if name in METHODS:
        raise UserError(f"method {reference}: {name!r} is the name of a fedcxr method; give yours another name")
    _check_classes([*(m.protocol for m in METHODS.values()), spec.protocol], reference)
    return spec


#: Files loaded as methods in this process: resolved path → module (a file is executed once).
_LOADED: dict[Path, object] = {}


def load_module(source: str):
    """The module of a reference's ``source``: a ``.py`` file (executed once per process under a name
    of its own) or an importable dotted module name."""
    if source.endswith(".py"):
        path = Path(source).expanduser().resolve()
        if path in _LOADED:
            return _LOADED[path]
        if not path.is_file():
            raise UserError(f"method {source}:...: no such file (a relative path is relative to the config's folder)")
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
        name = f"fedcxr_user_method_{_identifier(path.stem)}_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickle look a class's module up by name
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise UserError(f"method {source}: loading the file failed: {type(exc).__name__}: {exc}") from None
        _LOADED[path] = module
        return module
    if not all(part.isidentifier() for part in source.split(".")):
        raise UserError(f"method {source!r}: a method of your own is path/to/file.py:Name or package.module:Name")
    try:
        return importlib.import_module(source)
    except ImportError as exc:
        raise UserError(f"method {source}: cannot import it ({exc})") from None


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)[:40] or "method"


# --------------------------------------------------------------------------- derived registries


def _protocols(value: Optional[str]) -> list[type]:
    """The protocol classes of every built-in method, plus the referenced method's (in that order)."""
    classes = list(dict.fromkeys(spec.protocol for spec in METHODS.values()))
    if value is not None and is_reference(value):
        extra = resolve(value).protocol
        if extra not in classes:
            classes.append(extra)
    return classes


def option_models(value: Optional[str] = None) -> dict[str, type[MethodOptions]]:
    """Config key → options model of every built-in method and of ``value``'s (a reference)."""
    out: dict[str, type[MethodOptions]] = {}
    for cls in _protocols(value):
        if cls.options_key:
            out[cls.options_key] = cls.Options
    return out


def site_tasks(value: Optional[str] = None) -> dict[str, SiteTask]:
    """The tasks of every built-in method and of ``value``'s (a reference), beyond the runner's own."""
    out: dict[str, SiteTask] = {}
    for cls in _protocols(value):
        out.update(cls.site_tasks)
    return out


def site_tasks_for(spec: Optional[Method]) -> dict[str, SiteTask]:
    """:func:`site_tasks` for a method already loaded (a FLARE site loads a method of the user's own by
    its own rules, :mod:`fedcxr.flare.client`, never through :func:`resolve`)."""
    out = site_tasks()
    if spec is not None and spec.protocol not in _protocols(None):
        _check_classes([*_protocols(None), spec.protocol], spec.protocol.__name__)
        out.update(spec.protocol.site_tasks)
    return out


def _check_classes(classes: list[type], where: str) -> None:
    """One options model per config key, one handler per task name, no task named as the runner's own."""
    keys: dict[str, type] = {}
    tasks: dict[str, SiteTask] = {}
    for cls in dict.fromkeys(classes):
        key, model = cls.options_key, cls.Options
        if key is not None:
            if not (isinstance(model, type) and issubclass(model, MethodOptions)):
                raise UserError(f"{where}: {cls.__name__}.Options must be a MethodOptions subclass (its "
                                f"`{key}:` block)")
            if keys.get(key, model) is not model:
                raise UserError(f"{where}: the options key `{key}` is taken by another method's options "
                                f"({keys[key].__name__}); choose another options_key")
            keys[key] = model
        for task, entry in cls.site_tasks.items():
            if task in RUNNER_TASKS:
                raise UserError(f"{where}: {cls.__name__} declares site task {task!r}, a task every site answers "
                                "by itself; choose another name")
            if not isinstance(entry, SiteTask) or entry.config is None:
                raise UserError(f"{where}: {cls.__name__}.site_tasks[{task!r}] must be a SiteTask with its config "
                                "type (config=...)")
            _check_envelope(entry.config, f"{where}: {cls.__name__}.site_tasks[{task!r}]")
            if tasks.get(task, entry) is not entry:
                raise UserError(f"{where}: site task {task!r} is declared by two methods; choose another name")
            tasks[task] = entry


def _check_envelope(config: type, where: str) -> None:
    """A method's task config adds fields; redefining one of :class:`TrainTask`'s would change what every
    local training reads (``alpha`` is the aux losses' weight): refused."""
    from dataclasses import fields, is_dataclass

    from fedcxr.pipeline.messages import TaskConfig, TrainTask

    if not (isinstance(config, type) and issubclass(config, TaskConfig) and is_dataclass(config)):
        raise UserError(f"{where}: its config must be a TaskConfig dataclass (a TrainTask subclass)")
    if issubclass(config, TrainTask) and config is not TrainTask:
        own = set(getattr(config, "__annotations__", {})) - {"kind"}
        taken = sorted(own & {f.name for f in fields(TrainTask)})
        if taken:
            raise UserError(f"{where}: {config.__name__} redefines TrainTask's {taken}; give its fields names of "
                            "their own")

