"""The experiment config a workflow is handed: a YAML path, a mapping or an ``ExperimentConfig``.

``fedcxr train CONFIG.yaml --set rounds=2`` and ``fedcxr.train("CONFIG.yaml", rounds=2)`` must
validate the same config the same way, so both go through :func:`experiment_config`: the
``--set KEY=VALUE`` strings of the command line (``settings``) and the keyword arguments of the
Python API (``overrides``, a nested mapping merging into its block: ``source={"lr": 1e-3}`` is
``--set source.lr=0.001``) become one list of ``KEY=VALUE`` overrides for
:func:`fedcxr.pipeline.config.load_config` — the one place a config is read, overridden and
validated (a typo is a :class:`~fedcxr.errors.UserError` naming the key, never a traceback).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Union

if TYPE_CHECKING:  # pydantic is imported when a config is read, not when fedcxr is
    from fedcxr.pipeline.config import ExperimentConfig

#: what the API accepts as a config: a YAML file, the mapping it would hold, or a validated config
ConfigLike = Union[str, os.PathLike, Mapping, "ExperimentConfig"]


def experiment_config(config: ConfigLike, *, settings: Sequence[str] = (), overrides: Mapping[str, Any] | None = None,
                      check_sites: bool = True) -> "ExperimentConfig":
    """``config`` read (a path: relative ``manifests`` resolve against the YAML's folder; a mapping:
    against the working directory), overridden and validated.

    ``settings``: ``KEY=VALUE`` strings exactly as ``--set`` takes them (dotted keys, YAML
    values); ``overrides``: keyword values, applied after them (:func:`override_strings`).
    ``check_sites=False`` skips the check that every site's manifest exists (``flare export``)."""
    from fedcxr.pipeline.config import ExperimentConfig, load_config

    changes = [*settings, *override_strings(overrides or {})]
    if isinstance(config, ExperimentConfig):
        if not changes:
            return config
        return load_config(data=config.model_dump(mode="json"), overrides=changes, check_sites=check_sites)
    if isinstance(config, Mapping):
        return load_config(data=dict(config), overrides=changes, check_sites=check_sites)
    if isinstance(config, (str, os.PathLike)):
        return load_config(Path(config), overrides=changes, check_sites=check_sites)
    from fedcxr.errors import UserError

    raise UserError(f"config: expected a YAML file path, a mapping or an ExperimentConfig, got {type(config).__name__}")


def override_strings(overrides: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Keyword overrides as ``--set`` strings: ``{"rounds": 2, "source": {"lr": 1e-3}}`` →
    ``["rounds=2", "source.lr=0.001"]`` (values as JSON, which YAML reads back unchanged; paths as text)."""
    out: list[str] = []
    for key, value in overrides.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out += override_strings(value, prefix=name + ".")
        else:
            out.append(f"{name}={json.dumps(_plain(value))}")
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


__all__ = ["ConfigLike", "experiment_config", "override_strings"]
