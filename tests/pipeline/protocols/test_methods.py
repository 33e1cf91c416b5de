"""The registry is derived from the method modules (docs/methods.md): names, options, site tasks; every
entry builds its protocol, and an unknown name is answered with the known ones."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import fedcxr.pipeline.protocols as protocols
from fedcxr.errors import UserError
from fedcxr.pipeline.config import ExperimentConfig, load_config
from fedcxr.pipeline.protocols import REGISTRY, get_protocol
from fedcxr.pipeline.protocols.methods import (
    DEFAULT_METHOD,
    METHODS,
    RUNNER_TASKS,
    is_reference,
    method_name,
    option_models,
    resolve,
    site_tasks,
    unknown_method,
)
from fedcxr.pipeline.protocols.spec import MethodOptions, SiteTask

REPO = Path(__file__).resolve().parents[3]


def test_every_method_comes_from_the_methods_table_of_its_module():
    """Nothing is listed by hand: the names are the union of the modules' ``METHODS`` tables."""
    found = {}
    for info in pkgutil.iter_modules(protocols.__path__):
        module = importlib.import_module(f"{protocols.__name__}.{info.name}")
        if info.name != "methods" and isinstance(getattr(module, "METHODS", None), dict):
            found.update({name: spec.protocol.__module__ for name, spec in module.METHODS.items()})
    assert set(found) == set(METHODS) and len(METHODS) >= 31
    assert next(iter(METHODS)) == "FedAvg"  # the default method's family is listed first
    for name, spec in METHODS.items():
        assert spec.protocol.__module__ == found[name], name  # a name is declared where its protocol lives


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_builds_the_protocol_its_entry_names(name):
    spec = METHODS[name]
    protocol = get_protocol(name)
    assert type(protocol) is spec.protocol and protocol.name == name
    for option, value in spec.kwargs.items():
        assert getattr(protocol, option) == value, (name, option)


def test_the_registry_is_the_table_and_the_default_is_in_it():
    assert list(REGISTRY) == list(METHODS)
    assert DEFAULT_METHOD in METHODS
    assert ExperimentConfig(sites=["a"]).method == DEFAULT_METHOD


def test_the_method_modules_import_nothing_of_the_config():
    """The config checks a method against the registry when it loads, so no method module may import
    the config (that would make a cycle; the bounds' leaf ``config_bounds`` is fine); the registry's
    did-you-mean, ``fedcxr.suggest``, is a leaf."""
    root = REPO / "fedcxr"

    def imported(path: Path) -> list[str]:
        names = []
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                names += [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                names += [f"{n.module}.{a.name}" for a in n.names]
        return names

    for path in (root / "pipeline" / "protocols").glob("*.py"):
        config = [m for m in imported(path) if m.startswith("fedcxr.pipeline.config")
                  and not m.startswith("fedcxr.pipeline.config_bounds.")]
        assert not config, (path.name, config)
    assert not [m for m in imported(root / "suggest.py") if m.startswith("fedcxr")]


def test_an_unknown_method_is_answered_with_the_known_ones_bounded():
    message = unknown_method("FedAvgg")
    assert message.startswith("unknown method 'FedAvgg' (did you mean `FedAvg`?); known: FedAvg, FedAvg_Finetune,")
    assert all(name in message for name in METHODS)
    assert message.endswith("(or a method of your own: path/to/file.py:Name)")
    assert unknown_method("x" * 500).split(";")[0] == "unknown method '" + "x" * 76 + "..."
    assert unknown_method(["FedAvg"]).startswith("unknown method of type list;")
    with pytest.raises(UserError, match=r"unknown method 'FedAvgg' \(did you mean `FedAvg`\?\); known: FedAvg"):
        get_protocol("FedAvgg")
    with pytest.raises(UserError, match=r"unknown method 'FedAvgg' \(did you mean `FedAvg`\?\)"):
        load_config(data={"sites": ["a"], "method": "FedAvgg"}, check_sites=False)


def test_option_blocks_and_site_tasks_are_declared_by_the_protocols():
    models = option_models()
    assert {"fedprox", "scaffold", "fedopt", "gp", "finetune_offline", "surgical"} <= set(models)
    assert all(issubclass(m, MethodOptions) for m in models.values())
    tasks = site_tasks()
    assert not set(tasks) & set(RUNNER_TASKS)
    assert all(isinstance(t, SiteTask) and t.config is not None for t in tasks.values())
    owners = {name: [cls.__name__ for cls in {s.protocol for s in METHODS.values()} if name in cls.site_tasks]
              for name in tasks}
    assert owners["train_scaffold"] == ["SCAFFOLDProtocol"] and owners["warmup_head"] == ["SurgicalFamilyProtocol"]


def test_the_task_envelope_holds_no_methods_fields():
    """``TrainTask`` holds what every local training understands; a method's fields are in its own task config."""
    from dataclasses import fields

    from fedcxr.pipeline.messages import TrainTask

    names = {f.name for f in fields(TrainTask)}
    assert not names & {"prox_mu", "hold_for_combine", "from_warm", "repeat", "combine", "record_batch_updates",
                        "frozen_bn_trains"}
    # aux_reduction (issue 30 item 4): what every local training with AuxInfo reads; label_draw,
    # holdout_fold(s) (issue 30 items 1, 6): which labeled target rows any method's target trains on
    assert len(names) <= 27


def test_references_name_a_method_of_the_users_own(tmp_path):
    assert is_reference("a/b.py:Name") and is_reference("pkg.mod:Name") and not is_reference("FedAvg")
    assert method_name("a/b.py:FedAvgM") == "FedAvgM" and method_name("FedProx") == "FedProx"
    with pytest.raises(UserError, match="no such file"):
        resolve(str(tmp_path / "missing.py") + ":X")
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(UserError, match="loading the file failed: RuntimeError: boom"):
        resolve(f"{bad}:X")
    odd = tmp_path / "odd.py"
    odd.write_text("X = 1\n")
    with pytest.raises(UserError, match="neither a key of the module's METHODS table"):
        resolve(f"{odd}:X")
    clash = tmp_path / "clash.py"
    clash.write_text("from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol as FedAvg\n")
    with pytest.raises(UserError, match="is the name of a fedcxr method"):
        resolve(f"{clash}:FedAvg")


def test_a_method_of_ones_own_may_not_take_a_task_or_options_key_of_fedcxr(tmp_path):
    path = tmp_path / "taker.py"
    path.write_text(
        "from fedcxr.pipeline.messages import TrainTask\n"
        "from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol\n"
        "from fedcxr.pipeline.protocols.spec import MethodOptions, SiteTask\n"
        "class Opts(MethodOptions):\n    pass\n"
        "class TakesKey(FedAvgProtocol):\n    options_key = 'gp'\n    Options = Opts\n"
        "    def __init__(self, name):\n        super().__init__(name, finetune=False, aux_info=False)\n"
        "class TakesTask(TakesKey):\n    options_key = None\n"
        "    site_tasks = {'train_prox': SiteTask(lambda r, p, c: None, changes_state=True, config=TrainTask)}\n"
        "class TakesTrain(TakesKey):\n    options_key = None\n"
        "    site_tasks = {'evaluate': SiteTask(lambda r, p, c: None, changes_state=True, config=TrainTask)}\n"
        "from dataclasses import dataclass\n"
        "@dataclass(frozen=True)\nclass Shadow(TrainTask):\n    alpha: float = 0.01\n"
        "class TakesField(TakesKey):\n    options_key = None\n"
        "    site_tasks = {'train_shadow': SiteTask(lambda r, p, c: None, changes_state=True, config=Shadow)}\n")
    with pytest.raises(UserError, match="options key `gp` is taken"):
        resolve(f"{path}:TakesKey")
    with pytest.raises(UserError, match="site task 'train_prox' is declared by two methods"):
        resolve(f"{path}:TakesTask")
    with pytest.raises(UserError, match="a task every site answers by itself"):
        resolve(f"{path}:TakesTrain")
    with pytest.raises(UserError, match=r"Shadow redefines TrainTask's \['alpha'\]"):  # the aux losses' weight
        resolve(f"{path}:TakesField")


def test_the_readme_methods_table_lists_every_method():
    """The README's table of methods is checked against the registry, so it cannot fall behind."""
    text = (REPO / "README.md").read_text()
    table = text.split("Methods (`method:`), by the papers' names:", 1)[1].split("\n\n", 2)[1]
    listed = set()
    for row in table.splitlines():
        names = set(re.findall(r"`([A-Za-z][A-Za-z_]*)`", row))
        listed |= names | ({f"{n}_Finetune" for n in names} if "`_Finetune`" in row else set())
    missing = sorted(set(METHODS) - listed)
    assert not missing, f"README's Methods table lacks {missing}"


def test_new_methods_are_named_in_their_own_module_only():
    """Issue 29 item 2: a method is one module — each personalised method's name appears in no other
    ``.py`` under ``fedcxr/`` (not even a docstring)."""
    personal = {name for name, spec in METHODS.items()
                if spec.protocol.__module__.rsplit(".", 1)[1] in ("ditto", "fedrep", "fedper", "apfl", "fedbabu")}
    if not personal:
        pytest.skip("no personalised methods in this build")
    own = {name: Path(importlib.import_module(METHODS[name].protocol.__module__).__file__).resolve()
           for name in personal}
    found = []
    for path in (REPO / "fedcxr").rglob("*.py"):
        text = path.read_text()
        for name in personal:
            if path.resolve() != own[name] and re.search(rf"\b{re.escape(name)}\b", text):
                found.append(f"{path.relative_to(REPO)} names {name}")
    assert found == []


def test_no_code_outside_protocols_holds_a_method_name_as_a_string():
    """String constants (not docs) equal to a method's name live in ``pipeline/protocols/`` (DESIGN §1; the
    demo's methods too: ``protocols.methods.DEMO_METHODS``); ``zip3``'s "FL" is Florida."""
    allowed = {"fedcxr/site_adapters/zip3.py"}
    found = []
    for path in (REPO / "fedcxr").rglob("*.py"):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("fedcxr/pipeline/protocols/") or rel in allowed:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(n, clean=False) is not None}
        found += [f"{rel}:{n.lineno} {n.value}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in METHODS and id(n) not in docs]
    assert found == []
