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
    the table importing anything of fedcxr would make a cycle."""
    source = Path(__file__).resolve().parents[3] / "fedcxr" / "pipeline" / "protocols" / "methods.py"
    imports = [node for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [getattr(node, "module", None) for node in imports] == ["__future__"]


def test_an_unknown_method_is_answered_with_the_known_ones_bounded():
    message = unknown_method("FedAvgg")
    assert message.startswith("unknown method 'FedAvgg'; known: FedAvg, FedAvg_Finetune,")
    assert all(name in message for name in METHODS)
    assert unknown_method("x" * 500).split(";")[0] == "unknown method '" + "x" * 76 + "..."
    assert unknown_method(["FedAvg"]).startswith("unknown method of type list;")
    with pytest.raises(UserError, match="unknown method 'FedAvgg'; known: FedAvg"):
        get_protocol("FedAvgg")
    with pytest.raises(UserError, match="unknown method 'FedAvgg'"):
        load_config(data={"sites": ["a"], "method": "FedAvgg"}, check_sites=False)
