"""A faulty or hostile site, simulated for the tests and benchmarks only (SECURITY.md, "A faulty or hostile site").

This file is not part of the ``fedcxr`` package and nothing in fedcxr imports it: a run never
corrupts a reply unless a test or benchmark wraps its transport on purpose. Two ways in:

* :class:`HostileTransport` wraps any :class:`~fedcxr.pipeline.transport.Transport` (the
  in-process one) and rewrites the chosen sites' training replies in the chosen rounds (``train``
  and a method's own training task: :func:`trains`);
* :func:`corrupt` rewrites one :class:`~fedcxr.pipeline.messages.Reply`; the FLARE tests call it
  inside a test client script, so a FLARE site sends exactly what the in-process wrapper makes.

Faults (:data:`FAULTS`), as issue 19 lists them:

========================  ========================================================================
``huge``                  every floating entry of the update set to 1e30 (finite, float32)
``flip``                  the update sign-flipped and scaled: θ0 − 10·Δ
``flip1``                 the update sign-flipped: θ0 − Δ (a plausible norm)
``nan``                   one entry NaN
``inflate``               ``n_samples`` claimed as 10¹² (FedAvg would give it 99.9 % weight)
``overflow``              ``n_samples`` claimed as 10⁴⁰⁰ (a float of it overflows)
``count_float``           ``n_samples`` 40.5 (not an integer)
``count_negative``        ``n_samples`` −5
``count_bool``            ``n_samples`` True
``steps``                 ``n_batches`` claimed as 10⁶ (deflates a per-step norm)
``bn_shift``              honest counts and parameters, but every BatchNorm running mean shifted
                          (total change 0.5 × ``norm_limit`` × ‖θ0‖: just under the absolute bound
                          on the whole update; issue 27, item 1)
``bn_sigma``              every running mean moved by :data:`BN_SIGMA` of its own standard
                          deviations (the adaptive attacker under the BatchNorm check's floor)
``lie``                   (``metadata`` only) claims :data:`LIE` × its training rows
``lie_flip``              claims :data:`LIE` × its rows and steps; its weights θ0 − :data:`LIE_FLIP`·Δ,
                          its BatchNorm statistics honest (no negative variance to give it away)
``lie_zero``              claims :data:`LIE` × its rows and steps; sends back θ0 (a zero update)
========================  ========================================================================

Issue 27's size liar is ``{"metadata": "lie", 0: "lie_flip", "*": "lie_zero"}``: the claimed size
raised the step budget the relative norm check divides by, and the weight FedAvg gave it.
"""

from __future__ import annotations

import copy
from typing import Mapping, Optional

import torch

from fedcxr.pipeline.messages import Reply, StateDict
from fedcxr.pipeline.screening import planned_steps
from fedcxr.pipeline.transport import Transport

#: fault name → what it does (the module docstring's table)
FAULTS = ("huge", "flip", "flip1", "nan", "inflate", "overflow", "count_float", "count_negative", "count_bool",
          "steps", "bn_shift", "bn_sigma", "lie", "lie_flip", "lie_zero")
HUGE = 1e30
FLIP_SCALE = 10.0
#: ``bn_shift``: the running means' total change, as a fraction of ``norm_limit`` (100) × ‖θ0‖
BN_SHIFT = 0.5 * 100.0
#: ``bn_sigma``: each running mean's shift in standard deviations of the model the site received
BN_SIGMA = 0.9
#: ``lie*``: the factor a size liar multiplies its rows and steps by; ``lie_flip``'s flip scale
LIE = 1000
LIE_FLIP = 100.0


def corrupt(reply: Reply, fault: str, sent: Optional[Mapping[str, torch.Tensor]],
            config: Optional[Mapping] = None) -> Reply:
    """A copy of ``reply`` with ``fault`` applied; ``sent`` = the model the site received (θ0),
    ``config`` = its task config (a size liar claims the steps it allows for the rows it claims)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    out = copy.copy(reply)
    params: Optional[StateDict] = None if reply.params is None else dict(reply.params)
    if fault in ("huge", "flip", "flip1", "nan", "bn_shift", "bn_sigma") and params is None:
        return out
    if fault == "huge":
        params = {k: torch.full_like(v, HUGE) if v.is_floating_point() and v.dim() else v for k, v in params.items()}
    elif fault in ("flip", "flip1"):
        scale = FLIP_SCALE if fault == "flip" else 1.0
        if sent is None:
            raise ValueError("a sign-flipped update needs the model the site received")
        params = {k: _flipped(v, sent.get(k), scale) for k, v in params.items()}
    elif fault == "nan":
        key = next(k for k, v in params.items() if v.is_floating_point())
        params[key] = torch.full_like(params[key], float("nan"))
    elif fault == "inflate":
        out.n_samples = 10**12
    elif fault == "overflow":
        out.n_samples = 10**400
    elif fault == "count_float":
        out.n_samples = 40.5
    elif fault == "count_negative":
        out.n_samples = -5
    elif fault == "count_bool":
        out.n_samples = True
    elif fault == "steps":
        out.n_batches = 10**6
    elif fault in ("bn_shift", "bn_sigma") and params is not None and sent is not None:
        params = _bn_shifted(params, sent, fault)
    elif fault == "lie":
        out.n_samples = int(reply.n_samples) * LIE
        out.metrics = {**reply.metrics, "n_train": int(reply.metrics.get("n_train", reply.n_samples)) * LIE}
    elif fault in ("lie_flip", "lie_zero"):
        out.n_samples = int(reply.n_samples) * LIE
        planned = planned_steps(config, out.n_samples) if config is not None else None
        out.n_batches = planned if planned is not None else int(reply.n_batches) * LIE
        if params is not None and sent is not None:
            params = ({k: v if _bn_stat(k) else _flipped(v, sent.get(k), LIE_FLIP) for k, v in params.items()}
                      if fault == "lie_flip" else {k: sent[k].clone() if k in sent else v for k, v in params.items()})
    out.params = params
    return out


def _bn_stat(key: str) -> bool:
    return key.endswith(("running_mean", "running_var", "num_batches_tracked"))


def _bn_shifted(params: StateDict, sent: Mapping[str, torch.Tensor], fault: str) -> StateDict:
    """``bn_shift``: every running mean + c, ``c·√N = BN_SHIFT·‖θ0‖``; ``bn_sigma``: + BN_SIGMA·√var0."""
    means = [k for k in params if k.endswith("running_mean") and k in sent]
    if not means:
        return params
    out = dict(params)
    if fault == "bn_shift":
        norm = float(sum(float(v.double().square().sum()) for v in sent.values() if v.is_floating_point()) ** 0.5)
        count = sum(params[k].numel() for k in means)
        step = BN_SHIFT * norm / count ** 0.5
        for key in means:
            out[key] = params[key] + step
    else:
        for key in means:
            var = sent.get(key[: -len("running_mean")] + "running_var")
            out[key] = sent[key] + BN_SIGMA * (var.clamp(min=0) + 1e-5).sqrt() if var is not None else params[key]
    return out


def _flipped(value: torch.Tensor, sent: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """``θ0 − scale·(θ − θ0)`` for floating entries of the sent shape; others unchanged."""
    if sent is None or not value.is_floating_point() or tuple(sent.shape) != tuple(value.shape):
        return value
    return sent - scale * (value - sent)


class HostileTransport(Transport):
    """Rewrites the ``train`` replies of chosen sites in chosen rounds (tests and benchmarks only).

    ``faults``: ``{site: {round: fault}}``; round ``"*"`` means every round. Every other call
    passes through unchanged, so an honest run through this wrapper is the plain run.
    """

    def __init__(self, inner: Transport, faults: Mapping[str, Mapping]):
        self.inner = inner
        self.faults = {site: dict(rounds) for site, rounds in faults.items()}
        self.site_names = inner.site_names
        self.applied: list[dict] = []  # {"round", "site", "fault"} of every rewritten reply

    def fault_for(self, site: str, round_: Optional[int]) -> Optional[str]:
        rounds = self.faults.get(site, {})
        return rounds.get(round_, rounds.get(str(round_), rounds.get("*")))

    def run(self, task, targets, params, config, *, per_site=None):
        replies = self.inner.run(task, targets, params, config, per_site=per_site)
        if task == "metadata":  # a fault keyed "metadata" rewrites the site's answer at the start of the run
            for site, reply in list(replies.items()):
                fault = self.faults.get(site, {}).get("metadata")
                if fault:
                    replies[site] = corrupt(reply, fault, None)
                    self.applied.append({"round": None, "site": site, "fault": fault})
            return replies
        if not trains(task):
            return replies
        for site, reply in list(replies.items()):
            sent, site_config = (per_site or {}).get(site, (params, config))
            fault = self.fault_for(site, site_config.get("round"))
            if fault:
                replies[site] = corrupt(reply, fault, sent, site_config)
                self.applied.append({"round": site_config.get("round"), "site": site, "fault": fault})
        return replies

    def local_states(self):
        return self.inner.local_states()

    def load_local_states(self, states):
        self.inner.load_local_states(states)


def trains(task: str) -> bool:
    """Whether ``task`` is a round's training: ``train``, or a method's own task whose metrics are a round's
    training metrics (``SiteTask.streams == "train"``: FedProx's ``train_prox``, GP's ``train_gp``, ...), so
    a hostile site attacks every method's rounds, not FedAvg's only."""
    from fedcxr.pipeline.protocols.methods import site_tasks

    entry = site_tasks().get(task)
    return task == "train" or (entry is not None and entry.streams == "train")


def hostile_run(cfg, run_dir, faults: Mapping[str, Mapping], *, device: str = "cpu", progress: bool = False) -> dict:
    """``run_experiment`` with the in-process sites behind a :class:`HostileTransport` (returns run.json)."""
    from fedcxr.pipeline.engine import backend_settings
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners, run_engine
    from fedcxr.pipeline.devices import resolve_device

    dev = resolve_device(device)
    transport = HostileTransport(InProcessTransport(build_runners(cfg, dev, progress)), faults)
    with backend_settings(run_engine(cfg, dev)):
        return run_experiment(cfg, run_dir, progress=progress, transport=transport)
