"""The papers' authors' round loop, re-expressed (not copied) as a test oracle for fedcxr's protocols.

Read from the authors' public code (fetched for the replay, never part of this project):

* ``jackyzyb/AutoFedGP`` @ 7b10ca9 — ``main_domain_bed.py`` (FedDA, FedGP with a fixed β),
  ``main_domain_bed_auto_beta.py`` (FedDA_Auto, FedGP_Auto: ``train_source``, ``train_target``,
  ``update_global``, ``update_global_convex``, ``average_weights``) and ``empirical_metric.py``
  (``empirical_metrics_batch``: σ², d², τ²d², β);
* ``enyijiang/MIDRC`` @ 95291b2 — ``federated/federated_{chexpert,mimic,midrc}_multi.py`` (GP and
  AuxInfo+GP: ``update_global`` with b = 0.5, ``if i < 5: average_weights``).

What the loop does, round by round (each function below names the one it re-expresses):

1. warm-up (AutoFedGP: ``num_init = 2`` rounds before the loop; AuxInfo+GP: ``i < 5`` inside it):
   the sources train from the global model and the global becomes their ``average_weights``
   with ``clients_size_frac``; AuxInfo+GP then fine-tunes the target on that average and projects.
2. after AutoFedGP's warm-up, ``hparams["lr"] *= 0.1`` (auto script only); the target's lr is
   always ``lr · lr_ratio``.
3. each source trains one epoch from the global model with a fresh Adam; the auto script keeps its
   mean step ``Δ_i / #batches``; the target fine-tunes one epoch from the **global model** (θ0)
   with a fresh Adam, the auto script keeping every per-batch update ``× lr_ratio``.
4. the server combines per state-dict entry (``update_global``): cosine of the target's and the
   source's update, the source added where it is > 0 with the magnitude scale
   ``lr_ratio · (E_T/E_S) · ((n_T/bs_T)/(clients_size_i/bs_S)) · clients_size_frac_i``, the
   target's update weighted by ``(1 − β_i)·clients_size_frac_i`` (FedGP) or once by ``1 − β``
   (fixed-β script, AuxInfo+GP). ``clients_size_i = len(loader)·batch_size`` (whole batches).

The batches are handed in (the very batches fedcxr's sites drew), so the loop is compared on the
same data, order, initial weights and hyper-parameters. The few places where fedcxr departs on
purpose are arguments here, so the replay test can show each departure and its size:
``alignment`` (the target-update factor), ``estimator_keys`` (BN running statistics in the
auto-β estimators: re-expressed here from the model's parameters, :func:`parameter_keys`, so a change
of fedcxr's own key list shows) and ``zero_dim`` (``num_batches_tracked``).

The algorithm is the authors'; where only the float order is at stake, the loop uses fedcxr's, so
that equal algorithms give equal bits: Adam with ``foreach=True`` (:func:`adam`) and the sources'
average summed as ``Σ size_i·θ_i / Σ size`` (:func:`average_weights`). Adam makes this matter:
its first steps are about ±lr whatever the gradient's size, so a one-rounding difference in a
weight flips the step of every coordinate whose gradient is within rounding of zero (a conv bias
before a BatchNorm is one), and those steps perturb the next ones: a replay that rounds otherwise
drifts round by round (measured: 1.2e-7 after the first FedAvg, 5.6e-4 two rounds later).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from fedcxr.pipeline.losses import masked_bce

StateDict = dict[str, torch.Tensor]


# --------------------------------------------------------------------------- local training


def param_list(model: torch.nn.Module, keys: Optional[Sequence[str]] = None) -> torch.Tensor:
    """``get_param_list``: every non-0-dim state-dict entry, flattened in order (or ``keys`` only)."""
    state = model.state_dict()
    keys = [k for k, v in state.items() if v.dim() > 0] if keys is None else keys
    return torch.cat([state[k].detach().clone().flatten().float() for k in keys])


def parameter_keys(model: torch.nn.Module) -> list[str]:
    """The state-dict entries an optimiser steps: the model's ``named_parameters``. fedcxr's departure in
    the auto-β estimators (its ``estimator_keys``) re-expressed from the model itself, not from fedcxr's
    function: BatchNorm running statistics are buffers, changed by the forward pass and not by a step,
    so they are not parameters (the authors' networks had no moving ones; their estimators ran over
    every non-0-dim entry)."""
    return [name for name, _ in model.named_parameters()]


def adam(model: torch.nn.Module, lr: float) -> torch.optim.Adam:
    """The authors' fresh ``torch.optim.Adam(model.parameters(), lr)``, with fedcxr's ``foreach=True``
    (:func:`fedcxr.pipeline.local.make_optimizer`): the same update, one kernel over all tensors instead
    of a loop. On torch 2.13 CPU both give the same bits; pinned so that a torch release that changes
    one path's rounding does not show up here as a departure (Adam amplifies roundings, see
    :func:`average_weights`)."""
    return torch.optim.Adam(model.parameters(), lr=lr, foreach=True)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> None:
    """One optimiser step on one batch; the loss is the task's (fedcxr's masked BCE on the logits)."""
    optimizer.zero_grad()
    loss = masked_bce(model(batch["image"])["main"], batch["label"], batch["label_mask"])
    loss.backward()
    optimizer.step()


def train_source(model: torch.nn.Module, batches: Sequence[dict], lr: float) -> tuple[torch.nn.Module, torch.Tensor]:
    """``train_source``: one epoch, fresh Adam; returns the model and ``Δ / num_batches``."""
    optimizer = adam(model, lr)
    model.train()
    start = param_list(model)
    for batch in batches:
        _step(model, optimizer, batch)
    return model, (param_list(model) - start) / len(batches)


def train_target(model: torch.nn.Module, batches: Sequence[dict], lr: float, factor: float
                 ) -> tuple[torch.nn.Module, torch.Tensor]:
    """``train_target``: one epoch, fresh Adam; returns the model and every per-batch update × ``factor``
    (the authors' ``grads_all_epochs * args.lr_ratio``)."""
    optimizer = adam(model, lr)
    model.train()
    grads = []
    for batch in batches:
        start = param_list(model)
        _step(model, optimizer, batch)
        grads.append(param_list(model) - start)
    return model, torch.stack(grads) * factor


# --------------------------------------------------------------------------- auto-β estimators


def empirical_metrics(target_grads: torch.Tensor, source_grads: Sequence[torch.Tensor]) -> dict:
    """``empirical_metrics_batch``: σ² (``target_var``), d² (``source_target_var``), τ²d²
    (``projected_grads_norm_square``) and FedDA / FedGP β, exactly as their code computes them."""
    num_batches, dim = target_grads.shape
    mean = target_grads.mean(dim=0)
    sample_var = torch.sum((target_grads - mean) ** 2) / (num_batches - 1) / dim
    sigma2 = sample_var / num_batches
    d2, tau2d2 = [], []
    for s in source_grads:
        st = torch.sum((target_grads - s) ** 2) / num_batches / dim
        d2.append(max(float(st - sample_var), 0.0))
        proj = target_grads - (torch.sum(target_grads * s, dim=1) * s.view(-1, 1)).T / torch.norm(s) ** 2
        proj_mean = mean - torch.sum(mean * s) * s / torch.norm(s) ** 2
        proj_var = torch.sum((proj - proj_mean) ** 2) / (num_batches - 1) / dim
        proj_norm = torch.mean(torch.norm(proj, dim=1) ** 2) / dim
        tau2d2.append(max(float(proj_norm - proj_var), 0.0))
    sigma2 = float(sigma2)
    return {"sigma2": sigma2, "d2": d2, "tau2d2": tau2d2,
            "fedda": [sigma2 / (sigma2 + v) for v in d2], "fedgp": [sigma2 / (sigma2 + v) for v in tau2d2]}


# --------------------------------------------------------------------------- server rules


def average_weights(states: Sequence[StateDict], sizes: Sequence[float]) -> StateDict:
    """``average_weights``: Σ frac_i · state_i with ``frac_i = size_i / Σ size`` for every entry (0-dim
    ones too, as floats).

    Summed in fedcxr's float order, ``(Σ size_i · state_i) / Σ size``, not the authors'
    ``Σ frac_i · state_i``: the two are the same weighted mean and differ by one float32 rounding
    (1.2e-7 on a BatchNorm weight near 1), which the next rounds' Adam amplifies (module doc).
    The weights themselves stay the authors' (``clients_size``, whole batches)."""
    total = float(sum(sizes))
    out = {}
    for key in states[0]:
        acc = states[0][key].float() * float(sizes[0])
        for state, size in zip(states[1:], sizes[1:]):
            acc.add_(state[key].float(), alpha=float(size))
        out[key] = acc / total
    return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """``torch.nn.CosineSimilarity()`` of two flattened entries, as their code calls it."""
    return float(torch.nn.CosineSimilarity()(a.reshape(1, -1).float(), b.reshape(1, -1).float()))


def zero_dim_entry(key: str, old: StateDict, locals_: Sequence[StateDict], fracs: Sequence[float],
                   zero_dim: str) -> torch.Tensor:
    """A 0-dim entry after a GP-family round: the sources' average (``"fedavg"``, AutoFedGP's DomainBed
    scripts) or θ0's (``"keep"``, its noniid scripts and AuxInfo+GP)."""
    if zero_dim == "fedavg":
        return sum(float(f) * loc[key].float() for f, loc in zip(fracs, locals_))
    return old[key]


def gp_update(old: StateDict, finetuned: StateDict, locals_: Sequence[StateDict], *, betas: Sequence[float],
              scales: Sequence[float], fracs: Sequence[float], target_once: bool, zero_dim: str = "keep"
              ) -> tuple[StateDict, dict[str, list[float]]]:
    """``update_global`` (FedGP / GP): per entry, ``+ β_i·s_i·c_i·Δ_i`` where c_i > 0, and the target's
    update ``(1 − β_i)·frac_i`` per source (auto script) or ``(1 − β)`` once (fixed-β script, AuxInfo+GP).

    ``scales[i]`` is the whole magnitude factor ``lr_ratio·(E_T/E_S)·(n_T/bs_T)/(size_i/bs_S)·frac_i``.
    ``zero_dim``: ``"fedavg"`` (AutoFedGP DomainBed
    scripts average the sources' 0-dim entries) or ``"keep"`` (noniid scripts, AuxInfo+GP: θ0).
    Returns the new state and the per-entry cosines."""
    out, cosines = copy.deepcopy(old), {}
    for key, value in out.items():
        if value.dim() == 0:
            out[key] = zero_dim_entry(key, old, locals_, fracs, zero_dim)
            continue
        g_t = finetuned[key] - old[key]
        cosines[key] = []
        for i, loc in enumerate(locals_):
            g_i = loc[key] - old[key]
            c = cosine(g_t, g_i)
            cosines[key].append(c)
            if c > 0:
                out[key] = out[key] + betas[i] * scales[i] * c * g_i
            if not target_once:
                out[key] = out[key] + (1 - betas[i]) * g_t * float(fracs[i])
        if target_once:
            out[key] = out[key] + (1 - betas[0]) * g_t
    return out, cosines


def da_update(old: StateDict, finetuned: StateDict, locals_: Sequence[StateDict], *, betas: Sequence[float],
              fracs: Sequence[float], zero_dim: str = "keep") -> StateDict:
    """``update_global_convex`` (FedDA): ``+ β_i·frac_i·Δ_i + (1 − β_i)·frac_i·Δ_T`` per entry."""
    out = copy.deepcopy(old)
    for key, value in out.items():
        if value.dim() == 0:
            out[key] = zero_dim_entry(key, old, locals_, fracs, zero_dim)
            continue
        g_t = finetuned[key] - old[key]
        for i, loc in enumerate(locals_):
            out[key] = out[key] + betas[i] * float(fracs[i]) * (loc[key] - old[key])
            out[key] = out[key] + (1 - betas[i]) * g_t * float(fracs[i])
    return out


# --------------------------------------------------------------------------- the round loop


@dataclass
class Setting:
    """The hyper-parameters of one replay (the authors' argument names in comments)."""

    rule: str  # "fedgp" | "fedda" | "gp"
    auto: bool
    warmup: int  # AutoFedGP num_init (2), counted in the rounds as fedcxr does; GP: rounds with i < warmup
    lr_source: float  # hparams["lr"]
    lr_target: float  # hparams["lr"] * lr_ratio
    bs_source: int  # hparams["batch_size"]
    bs_target: int  # target_batch_size (the fixed-β DomainBed script hard-codes 16)
    n_target: int  # n_target_samples
    beta: float = 0.5  # proj_w / b
    post_warmup_lr_scale: float = 0.1  # the auto script's hparams["lr"] *= 0.1
    alignment: str = "lr_t_over_lr_s"  # the authors' grads × lr_ratio; fedcxr: "lr_s_over_lr_t"
    #: the entries the auto-β estimators run over: None, every non-0-dim entry (theirs); "parameters", the
    #: model's trained parameters only (fedcxr's departure: :func:`parameter_keys`)
    estimator_keys: Optional[str] = None
    zero_dim: str = "keep"


@dataclass
class RoundRecord:
    """What the replay computed in one round (compared with fedcxr's)."""

    lr_source: float
    lr_target: Optional[float] = None
    steps_source: list[int] = field(default_factory=list)
    steps_target: Optional[int] = None
    scales: list[float] = field(default_factory=list)
    cosines: dict = field(default_factory=dict)
    estimates: dict = field(default_factory=dict)
    betas: list[float] = field(default_factory=list)
    global_after: Optional[StateDict] = None
    trained: dict[str, StateDict] = field(default_factory=dict)  # each site's model after its local training


def replay(setting: Setting, make_model: Callable[[], torch.nn.Module], theta: StateDict, rounds: int,
           batches: Callable[[str, int], list[dict]], sources: Sequence[str], target: str,
           n_sources: Sequence[int], starts: Optional[Callable[[int], StateDict]] = None) -> list[RoundRecord]:
    """Run the authors' loop for ``rounds`` rounds from ``theta``; ``batches(site, round)`` gives the
    batches that site drew in that round (the same as fedcxr's); ``n_sources`` the sources' rows.

    ``starts(r)``: the global model round ``r`` starts from (a comparison passes fedcxr's, so that
    each round is checked on its own inputs and one round's float rounding is not amplified by the
    next rounds' Adam); None: the loop's own previous result (``theta`` for round 0)."""
    fracs_of = lambda sizes: [s / sum(sizes) for s in sizes]  # noqa: E731  (clients_size_frac)
    sizes = [-(-n // setting.bs_source) * setting.bs_source for n in n_sources]  # len(loader) * batch_size
    fracs = fracs_of(sizes)
    records = []
    for r in range(rounds):
        if starts is not None:
            theta = {k: v.clone() for k, v in starts(r).items()}
        scale = setting.post_warmup_lr_scale if (setting.auto and r >= setting.warmup) else 1.0
        lr_s, lr_t = setting.lr_source * scale, setting.lr_target * scale
        record = RoundRecord(lr_source=lr_s)
        locals_, source_grads = [], []
        for site in sources:
            model = make_model()
            model.load_state_dict(theta)
            model, grad = train_source(model, batches(site, r), lr_s)
            locals_.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            record.trained[site] = locals_[-1]
            source_grads.append(grad)
            record.steps_source.append(len(batches(site, r)))
        if r < setting.warmup:  # the sources' average (AuxInfo+GP: the base the target starts from)
            theta = {k: v.to(theta[k].dtype) for k, v in average_weights(locals_, sizes).items()}
            if setting.rule != "gp":  # AutoFedGP: plain FedAvg rounds
                record.global_after = theta
                records.append(record)
                continue
        model = make_model()
        model.load_state_dict(theta)
        lr_ratio = lr_t / lr_s
        factor = lr_ratio if setting.alignment == "lr_t_over_lr_s" else 1.0 / lr_ratio
        model, target_grads = train_target(model, batches(target, r), lr_t, factor)
        finetuned = {k: v.detach().clone() for k, v in model.state_dict().items()}
        record.trained[target] = finetuned
        record.lr_target, record.steps_target = lr_t, len(batches(target, r))
        betas = [setting.beta] * len(sources)
        if setting.auto:
            est_keys = parameter_keys(make_model()) if setting.estimator_keys == "parameters" else None
            all_keys = [k for k, v in theta.items() if v.dim() > 0]
            if est_keys is not None:
                columns = torch.cat([torch.full((theta[k].numel(),), k in set(est_keys)) for k in all_keys])
                target_grads = target_grads[:, columns]
                source_grads = [g[columns] for g in source_grads]
            record.estimates = empirical_metrics(target_grads, source_grads)
            betas = record.estimates[setting.rule]
        record.betas = list(betas)
        n_t_steps = setting.n_target / setting.bs_target
        record.scales = [lr_ratio * n_t_steps / (size / setting.bs_source) * f  # E_T/E_S = 1
                         for size, f in zip(sizes, fracs)]
        if setting.rule == "fedda":
            new = da_update(theta, finetuned, locals_, betas=betas, fracs=fracs, zero_dim=setting.zero_dim)
        else:
            new, record.cosines = gp_update(theta, finetuned, locals_, betas=betas, scales=record.scales,
                                            fracs=fracs, target_once=not setting.auto, zero_dim=setting.zero_dim)
        theta = {k: v.to(theta[k].dtype) for k, v in new.items()}
        record.global_after = theta
        records.append(record)
    return records
