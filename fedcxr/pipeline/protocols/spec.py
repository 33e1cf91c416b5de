"""What a method module declares besides its protocol class (docs/methods.md): options, names, site tasks.

A method is one module — fedcxr's own (``fedcxr/pipeline/protocols/<family>.py``) or a user's file
(``method: path/to/file.py:Name``). Next to its :class:`~fedcxr.pipeline.protocols.base.RoundProtocol`
subclass it declares:

* its **options**: a :class:`MethodOptions` model, set as the protocol's ``Options`` with the config
  key ``options_key`` (``fedprox: {mu: 0.01}``);
* its **site tasks**: ``site_tasks = {name: SiteTask(handler, config=..., ...)}`` on the protocol
  class (:class:`~fedcxr.pipeline.site_runner.SiteTask`; ``config`` a
  :class:`~fedcxr.pipeline.messages.TrainTask` subclass holding the fields only this method sends —
  its share of the task envelope);
* its **names**: ``METHODS = {"Name": method(ProtocolClass, **kwargs)}``.

:mod:`fedcxr.pipeline.protocols.methods` collects them; nothing registers itself by being imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

# the config's bounds on sizes and counts (SECURITY.md R7), for options blocks: from their leaf (the config
# imports the method modules, never the other way round)
from fedcxr.pipeline.config_bounds import MAX_BATCH, MAX_EPOCHS, MAX_ROUNDS, MAX_STEPS
from fedcxr.pipeline.site_runner import SiteTask

__all__ = ["MAX_BATCH", "MAX_EPOCHS", "MAX_ROUNDS", "MAX_STEPS", "METHOD_DEFAULT", "Method", "MethodOptions", "SiteTask",
           "method"]


#: The description of an option whose default is the method's own (set with its source in the protocol).
METHOD_DEFAULT = "null: the method's default, set with its source in the method's protocol (README's table of defaults)"


class MethodOptions(BaseModel):
    """Base of a method's options block: every key checked (a misspelt one is an error, never ignored),
    every float finite. Fields left out take their defaults; ``None`` conventionally means "the
    method's default, set with its source in the protocol" (as the config's other fields)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


@dataclass(frozen=True)
class Method:
    """One method name's recipe: its protocol class and the keyword arguments it is built with
    (``protocol(name, **kwargs)``)."""

    protocol: type
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self, name: str):
        """The protocol object that runs this method under ``name``."""
        return self.protocol(name, **self.kwargs)


def method(protocol: type, **kwargs: Any) -> Method:
    """``METHODS = {"FedProx": method(FedProxProtocol, finetune=False)}``."""
    return Method(protocol, dict(kwargs))
