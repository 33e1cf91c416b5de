"""Shared set-up of the personalised methods' tests: three sources, their runners, the context, θ0."""

from __future__ import annotations

import torch

from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.devices import resolve_device
from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
from fedcxr.pipeline.protocols import get_protocol
from fedcxr.pipeline.run_driver import build_context, initial_model

from ...conftest import tiny_config

SOURCES = ["nih_style", "chexpert_style", "dicom_style"]


def federation(manifests, cache, method: str, **overrides):
    """``(cfg, protocol, ctx, θ0, runners)`` of a sources-only run of ``method`` over three sites."""
    data = tiny_config(manifests, cache, strategy=method, sites=SOURCES, target=None, rounds=2,
                       class_source="union", eval_every=0, **overrides)
    cfg = load_config(data=data)
    runners = build_runners(cfg, resolve_device("cpu"), progress=False)
    protocol = get_protocol(cfg.method)
    ctx = build_context(cfg, protocol, InProcessTransport(runners))
    theta0 = initial_model(cfg, ctx)
    return cfg, protocol, ctx, theta0, runners


def max_diff(a: dict, b: dict) -> float:
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)


def recording(runner, calls: list):
    """Wrap ``runner.train`` to record each call's received params, config and hooks (then train)."""
    inner = runner.train

    def train(params, config, **hooks):
        calls.append({"params": {k: v.clone() for k, v in params.items()}, "config": config, "hooks": hooks})
        return inner(params, config, **hooks)

    runner.train = train
    return runner


def same(a: dict, b: dict, keys) -> bool:
    return all(torch.equal(a[k], b[k]) for k in keys)
