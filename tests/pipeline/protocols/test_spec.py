"""What a method module declares (fedcxr.pipeline.protocols.spec)."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from fedcxr.pipeline import config
from fedcxr.pipeline.protocols import spec


def test_option_bounds_are_the_configs():
    """Options blocks are bounded like the config's own keys (SECURITY.md R7)."""
    for name in ("MAX_ROUNDS", "MAX_EPOCHS", "MAX_STEPS", "MAX_BATCH"):
        assert getattr(spec, name) == getattr(config, name), name


def test_method_options_refuse_unknown_keys_and_non_finite_numbers():
    class Options(spec.MethodOptions):
        lam: float = Field(0.1, ge=0)

    assert Options().lam == 0.1
    with pytest.raises(ValidationError, match="Extra inputs"):
        Options.model_validate({"lambda": 1.0})
    with pytest.raises(ValidationError):
        Options.model_validate({"lam": float("inf")})


def test_a_method_entry_builds_its_protocol_under_its_name():
    class Protocol:
        def __init__(self, name, *, flag):
            self.name, self.flag = name, flag

    entry = spec.method(Protocol, flag=True)
    built = entry.build("Mine")
    assert (built.name, built.flag) == ("Mine", True)
