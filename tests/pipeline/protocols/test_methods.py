"""The one table of method names (fedcxr.pipeline.protocols.methods): every entry builds its protocol,
the table stays a leaf the config can read, and an unknown name is answered with the known ones."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fedcxr.errors import UserError
from fedcxr.pipeline.config import ExperimentConfig, load_config
from fedcxr.pipeline.protocols import REGISTRY, get_protocol
from fedcxr.pipeline.protocols.methods import DEFAULT_METHOD, METHODS, unknown_method


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_builds_the_protocol_its_entry_names(name):
    cls, options = METHODS[name]
    protocol = get_protocol(name)
    assert type(protocol).__name__ == cls and protocol.name == name
    for option, value in options.items():
        assert getattr(protocol, option) == value, (name, option)


def test_the_registry_is_the_table_and_the_default_is_in_it():
    assert list(REGISTRY) == list(METHODS)
    assert DEFAULT_METHOD in METHODS
    assert ExperimentConfig(sites=["a"]).method == DEFAULT_METHOD


def test_the_table_is_a_leaf_the_config_can_import():
    """The config checks names against the table when it loads, and the protocols import the config:
    the table importing anything of fedcxr but a leaf would make a cycle. Its one fedcxr import,
    ``fedcxr.suggest`` (did-you-mean), must itself import nothing of fedcxr."""
    root = Path(__file__).resolve().parents[3] / "fedcxr"

    def modules(path: Path) -> list:
        tree = ast.parse(path.read_text())
        return [getattr(n, "module", None) or n.names[0].name for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom))]

    assert modules(root / "pipeline" / "protocols" / "methods.py") == ["__future__", "fedcxr.suggest"]
    assert not [m for m in modules(root / "suggest.py") if m.startswith("fedcxr")]


def test_an_unknown_method_is_answered_with_the_known_ones_bounded():
    message = unknown_method("FedAvgg")
    assert message.startswith("unknown method 'FedAvgg' (did you mean `FedAvg`?); known: FedAvg, FedAvg_Finetune,")
    assert all(name in message for name in METHODS)
    assert unknown_method("x" * 500).split(";")[0] == "unknown method '" + "x" * 76 + "..."
    assert unknown_method(["FedAvg"]).startswith("unknown method of type list;")
    with pytest.raises(UserError, match=r"unknown method 'FedAvgg' \(did you mean `FedAvg`\?\); known: FedAvg"):
        get_protocol("FedAvgg")
    with pytest.raises(UserError, match="unknown method 'FedAvgg'"):
        load_config(data={"sites": ["a"], "method": "FedAvgg"}, check_sites=False)
