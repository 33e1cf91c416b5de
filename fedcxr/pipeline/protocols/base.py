"""The protocol framework: what a round protocol knows and how it asks sites (DESIGN §8).

* :class:`Context` — the federation as a protocol sees it (config, transport, metadata,
  classes, sources, target); never any patient data.
* :func:`task_config` — the typed config (:class:`~fedcxr.pipeline.messages.TrainTask`) of a ``train`` task.
* :func:`ask`, :func:`ask_one`, :func:`valid_replies` — run a task through the transport,
  record absent sites, screen every reply (:func:`screen`: counts against the site's
  metadata, shapes, NaN/Inf, update norms, BatchNorm statistics — ``defences:``), record
  refusals with their reason, credit no site more than ``defences.max_share`` of a
  sample-weighted average, stop a run whose sites fail after a refused one or whose majority
  is refused two rounds in a row (:class:`SuspectSite`), fail a round below ``min_sites``.
* :class:`RoundProtocol` — the base class every method's protocol extends.
* :func:`aggregate_backbone` — FedAvg/FedBN (or the config's robust ``aggregation.rule``) of the
  shared entries, used by several protocols.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

from fedcxr.errors import RunFailed, UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline import screening
from fedcxr.pipeline.labeled_rows import target_rows
from fedcxr.pipeline.messages import Reply, StateDict, TaskConfig, TrainTask
from fedcxr.pipeline.participation import sample_size, sample_sites
from fedcxr.pipeline.state import _structure_problem, nonfinite_problem
from fedcxr.pipeline.run_log import round_number
from fedcxr.pipeline.transport import Transport

log = logging.getLogger(__name__)

#: The experiment config (:class:`fedcxr.pipeline.config.ExperimentConfig`). Not imported: the config
#: validates a ``method`` against the method modules, which extend this one (docs/methods.md).
ExperimentConfig = Any

#: The pooled site of the Central baseline (every site's rows in one place).
CENTRAL_SITE = "__central__"


class RoundFailed(RunFailed):
    """A round cannot count: too few sites answered (``min_sites``) or a needed update was bad."""


class SuspectSite(RoundFailed):
    """The model may be poisoned: sites' updates turned NaN/Inf after another site's reply was
    refused, or most replies were refused two rounds in a row while a few still pass.

    The run stops (exit 1) naming the suspect instead of going on without the honest sites
    (``defences.stop_on_suspect``)."""


@dataclass
class Context:
    """What a protocol knows about the federation (never any patient data)."""

    cfg: ExperimentConfig
    transport: Transport
    meta: dict[str, Reply]  # metadata replies per site
    classes: list[str]  # global head classes, canonical order
    aux_tasks: list[str]  # [] when AuxInfo is off
    sources: list[str]
    target: Optional[str]
    bn_keys: list[str] = field(default_factory=list)
    head_keys: list[str] = field(default_factory=list)
    missed: list[dict] = field(default_factory=list)  # {"round", "task", "site", "why", "reason"}: no part taken
    refused: list[dict] = field(default_factory=list)  # {"round", "task", "site", "check", "reason"} (screen)
    sent: dict = field(default_factory=dict)  # site → the task config it got in the latest ask (lr, step budget)
    notes: dict = field(default_factory=dict)  # this round's extra metrics (robust rule: who was kept/clipped)
    said: set = field(default_factory=set)  # notices already logged this run (see :meth:`once`)
    task_defaults: dict = field(default_factory=dict)  # the method's optimiser defaults (RoundProtocol.task_defaults)
    screened: dict = field(default_factory=dict)  # round → [replies screened, refused] (stop_if_majority_refused)

    def class_set(self, site: str) -> list[str]:
        return [c for c in self.classes if c in self.meta[site].class_set]

    def once(self, key: tuple) -> bool:
        """True the first time ``key`` is seen in this run: a per-site notice is logged once, not every round."""
        if key in self.said:
            return False
        self.said.add(key)
        return True


# --------------------------------------------------------------------------- task configs


#: The values a method uses for the local-training settings a config leaves unset, unless its
#: protocol's :meth:`RoundProtocol.task_defaults` says otherwise (each with the code it follows):
#:
#: * ``optimizer`` (``source.optimizer``, ``target_train.optimizer``): Adam, as the AuxInfo+GP,
#:   AutoFedGP and surgical aggregation code (FACT: SGD);
#: * ``weight_decay``: 0 (FACT: 5e-4);
#: * ``momentum`` (SGD only): 0.9, as FACT's ``client.py`` (SCAFFOLD's sources: 0, plain SGD);
#: * ``optimizer_state``: ``fresh``, a new optimiser every round, as AuxInfo+GP and AutoFedGP build
#:   a new Adam in every ``train()`` call (the surgical family and FACT: ``kept``);
#: * ``target_batch_size`` (``target_train.batch_size``): 32, AuxInfo+GP
#:   ``federated_chexpert/mimic_multi.py --target_batch_size 32`` (AutoFedGP's methods: 16, or 4
#:   for the auto-weighted ones).
BASE_TASK_DEFAULTS = {"optimizer": "adam", "weight_decay": 0.0, "momentum": 0.9, "optimizer_state": "fresh",
                      "target_batch_size": 32}


def task_config(ctx: Context, r: int, role: str, **overrides) -> TrainTask:
    """The :class:`~fedcxr.pipeline.messages.TrainTask` of a source or the target in round ``r``;
    ``overrides`` replace fields (a misspelt one is an error, never a key the site ignores)."""
    cfg = ctx.cfg
    local = cfg.target_train if role == "target" else cfg.source
    defaults = {**BASE_TASK_DEFAULTS, **ctx.task_defaults}
    values = {
        "round": r, "seed": cfg.seed, "role": role,
        "param_classes": list(ctx.classes), "head_classes": list(ctx.classes),
        "aux_tasks": list(ctx.aux_tasks), "alpha": cfg.alpha, "aux_reduction": cfg.aux_reduction,
        "use_aux": bool(ctx.aux_tasks) and role == "source",
        "lr": local.lr, "batch_size": target_batch_size(ctx) if role == "target" else local.batch_size,
        "epochs": local.epochs, "steps": local.steps,
        "weight_decay": local.weight_decay if local.weight_decay is not None else defaults["weight_decay"],
        "optimizer": local.optimizer or defaults["optimizer"],
        "momentum": local.momentum if local.momentum is not None else defaults["momentum"],  # SGD only
        "keep_optimizer": (cfg.optimizer_state or defaults["optimizer_state"]) == "kept",
        "max_rows": local.max_rows,
        # FedBN+ (surgical aggregation paper): BN frozen in eval mode during local training
        "freeze_bn": cfg.backbone_aggregation == "fedbn_plus",
        "labeled": cfg.target_train.labeled if role == "target" else None,
        **(target_rows(cfg.target_train) if role == "target" else {}),
        "dp": cfg.privacy.dp.model_dump() if cfg.privacy.dp is not None else None,
    }
    return TrainTask.build(**{**values, **overrides})


def target_batch_size(ctx: Context) -> int:
    """``target_train.batch_size``, else the method's default (:meth:`RoundProtocol.task_defaults`)."""
    value = ctx.cfg.target_train.batch_size
    default = ctx.task_defaults.get("target_batch_size", BASE_TASK_DEFAULTS["target_batch_size"])
    return int(value) if value is not None else int(default)


def round_sources(ctx: Context, r: int) -> list[str]:
    """The sources round ``r`` asks (``participation:``): every source, or a share drawn from the
    run's seed and the round (:func:`~fedcxr.pipeline.participation.sample_sites`), in ``sources``
    order. A sampled round's metrics name them (``asked``); the target is never sampled out."""
    spec = ctx.cfg.participation
    asked = sample_sites(ctx.sources, spec.fraction, spec.min_sites, ctx.cfg.seed, r)
    if len(asked) < len(ctx.sources):
        ctx.notes["asked"] = list(asked)
    return asked


def ask(ctx: Context, task: str, sites: list[str], params: Optional[StateDict], config: Optional[TaskConfig], *,
        r: int, per_site=None, minimum: Optional[int] = None) -> dict[str, Reply]:
    """Run a task; record absent sites with why (late, dropped out, error: the transport's ``absent``);
    fail the round when fewer than ``minimum`` (default ``participation.min_sites``) answered.

    ``config`` is the task's typed config (``None`` when ``per_site`` gives every site its own)."""
    replies = ctx.transport.run(task, sites, params, config, per_site=per_site)
    absent = getattr(ctx.transport, "absent", None) or {}
    for site in sites:
        ctx.sent[site] = (per_site or {}).get(site, (params, config))[1]
        if site not in replies:
            why, reason = absence(absent.get(site))
            ctx.missed.append({"round": r, "task": task, "site": site, "why": why, "reason": reason})
            log.warning("round %d: site %s did not answer task %s (%s)", round_number(r), site, task, reason)
    need = min(len(sites), ctx.cfg.min_sites if minimum is None else minimum)
    if len(replies) < need:
        raise RoundFailed(f"round {round_number(r)}: only {len(replies)} of {len(sites)} sites answered {task!r} "
                          f"(need {need}{', participation.min_sites' if minimum is None else ''}); {missed_text(ctx, r)}")
    return replies


#: why an asked site did not take part (``run.json`` ``missed``, ``metrics.jsonl`` ``missed``)
ABSENCES = ("late", "dropped", "error", "refused", "no reply")


def absence(entry) -> tuple[str, str]:
    """``(why, reason)`` of a transport's :attr:`~fedcxr.pipeline.transport.Transport.absent` entry."""
    if isinstance(entry, dict) and entry.get("why") in ABSENCES:
        return entry["why"], str(entry.get("reason") or entry["why"])
    return "no reply", "no reply"


def missed_text(ctx: Context, r: int, limit: int = 8) -> str:
    """Who did not take part in round ``r`` and why, for a failed round's message."""
    seen = {}
    for e in ctx.missed:
        if e.get("round") == r:
            seen.setdefault(e["site"], e.get("reason") or e.get("why") or "no reply")
    if not seen:
        return "every asked site answered"
    shown = "; ".join(f"{site}: {reason}" for site, reason in list(seen.items())[:limit])
    more = f"; and {len(seen) - limit} more" if len(seen) > limit else ""
    return (f"not taking part: {shown}{more} (run.json `missed`). The run stops; --resume retries the round (a "
            "simulated consortium draws the same again: lower participation.min_sites or raise its fraction or "
            "deadline_s)")


def ask_one(ctx: Context, task: str, site: str, params: Optional[StateDict], config: TaskConfig, *, r: int,
            reference: Optional[StateDict] = None) -> Reply:
    """Ask one site the round cannot do without (target, pooled site); its reply is screened.

    ``reference`` (default: the params sent) gives the expected keys and shapes; a reply that
    fails :func:`screen` (a bad count, NaN/Inf, a wrong shape, an implausible norm) fails the
    round rather than entering the model.
    """
    reply = ask(ctx, task, [site], params, config, r=r, minimum=1)[site]
    check_one(ctx, reply, params if reference is None else reference, r, task=task)
    return reply


def check_one(ctx: Context, reply: Reply, reference: Optional[StateDict], r: int, *, task: str = "train") -> None:
    """Screen a reply the round needs (the target's, the pooled site's): refused → the round fails.

    Counts, shapes, NaN/Inf and the absolute norm bound only: the target is never compared with
    the sources' norms. It trains on other data at its own learning rate, often for a few steps
    (a few Adam steps move every weight by about lr each, many steps partly cancel), so its
    update per step is not comparable with theirs; and it is the party the run adapts to.
    """
    problem = screen(ctx, reply, reference, r, task=task)
    if problem is None:
        return
    check, reason = problem
    refuse(ctx, r, task, reply.site, check, reason)
    stop_if_suspect(ctx, r, [reply.site] if check == "values" else [])
    raise RoundFailed(f"round {round_number(r)}: rejected the update of {reply.site} ({task}): {reason}")


def valid_replies(ctx: Context, replies: dict[str, Reply], reference: StateDict | Callable[[Reply], StateDict],
                  r: int, *, task: str = "train", minimum: Optional[int] = None) -> dict[str, Reply]:
    """The replies that may be aggregated: each one screened (:func:`screen`), then their update
    norms and their BatchNorm statistics compared with each other (``defences.norm_factor``,
    ``defences.bn_factor``); refusals recorded with the reason; each kept reply's count credited
    at most ``defences.max_share`` of the round (:func:`credit_counts`).

    ``reference`` gives the expected keys and shapes and the model the update started from: one
    state for every site, or a function of the reply (surgical aggregation: each site's head has
    its own classes' rows). Fails the round below ``minimum`` (default ``min_sites``) valid
    replies, and stops the run when honest sites fail after a refused one (:func:`stop_if_suspect`)
    or when most replies are refused two rounds in a row (:func:`stop_if_majority_refused`).
    """
    kept, stats, shifts, failed, refused = {}, {}, {}, [], []
    for site, reply in replies.items():
        expected = reference(reply) if callable(reference) else reference
        problem = _count_problem(ctx, reply, task)
        if problem is None and reply.n_samples == 0:
            # A site with no training rows for the model's classes returned θ0 unchanged;
            # averaging it in would only shrink the others' updates.
            if ctx.once(("no rows", site)):
                log.warning("site %s has no training rows for the model's classes %s: its replies are not "
                            "aggregated (said once per run)", site, ctx.classes)
            continue
        problem = problem or screen(ctx, reply, expected, r, task=task, counted=True)
        if problem:
            refuse(ctx, r, task, site, *problem)
            failed += [site] if problem[0] == "values" else []
            refused.append(site)
            continue
        kept[site] = reply
        if sealed_aggregation(ctx) is None:  # a ciphertext has no norm or BN shift the server can read
            stats[site] = _step_norm(ctx, reply, expected)
            shift = _bn_shift(ctx, reply, expected)
            if shift is not None:
                shifts[site] = shift
    screened = len(kept) + len(refused)
    for site, reason in _relative_outliers(ctx, stats, shifts).items():
        refuse(ctx, r, task, site, "norm", reason)
        kept.pop(site)
        refused.append(site)
    stop_if_suspect(ctx, r, failed)
    stop_if_majority_refused(ctx, r, screened, refused, list(kept))
    need = min(len(replies), ctx.cfg.min_sites if minimum is None else minimum)
    if not kept or len(kept) < need:
        raise RoundFailed(f"round {round_number(r)}: only {len(kept)} valid updates (need {max(need, 1)}); "
                          f"{missed_text(ctx, r)}")
    return credit_counts(ctx, kept, r)


def _relative_outliers(ctx: Context, stats: dict[str, float], shifts: dict[str, float]) -> dict[str, str]:
    """``{site: reason}`` for the replies the leave-one-out median of the others refuses: the update
    norm per step and unit of lr (``defences.norm_factor``) and — separately, in their own units
    (:func:`~fedcxr.pipeline.screening.bn_shift`), above half a standard deviation — the BatchNorm
    running statistics (``defences.bn_factor``)."""
    out = {}
    bn_factor = ctx.cfg.defences.bn_factor
    for site, (value, ref) in (screening.norm_outliers(shifts, bn_factor) if bn_factor else {}).items():
        if value <= screening.BN_FLOOR:
            continue
        out[site] = (f"BatchNorm running statistics moved {value:.3g} standard deviations (RMS over channels), "
                     f"above {bn_factor:g} × the median of the round's other replies ({ref:.3g}) and above "
                     f"{screening.BN_FLOOR:g} (defences.bn_factor)")
    factor = ctx.cfg.defences.norm_factor
    for site, (value, ref) in (screening.norm_outliers(stats, factor) if factor else {}).items():
        out[site] = (f"update norm per step and unit of lr {value:.3g} is above {factor:g} × the median of the "
                     f"round's other replies ({ref:.3g}) (defences.norm_factor)")
    return out


def credit_counts(ctx: Context, kept: dict[str, Reply], r: int) -> dict[str, Reply]:
    """The kept replies with each ``n_samples`` credited at most ``defences.max_share`` of the round.

    Every sample-weighted rule (FedAvg, FedBN, FedProx, SCAFFOLD, FedOpt, GP/FedDA/FedGP's
    source weights, norm clipping) reads the counts of these replies, so capping them here caps
    a site's weight in all of them (:func:`~fedcxr.pipeline.screening.capped_counts`: only the
    counts above their share are lowered; three replies or more). An honest run of a balanced
    consortium is never capped; when a count is, the round's metrics say so (``weight_cap``).
    """
    sites = list(kept)
    counts = [int(kept[s].n_samples) for s in sites]
    credited = screening.capped_counts(counts, ctx.cfg.defences.max_share)
    if credited is counts:
        return kept
    out = dict(kept)
    for site, claimed, count in zip(sites, counts, credited):
        if count != claimed:
            out[site] = dataclasses.replace(kept[site], n_samples=int(count))
            ctx.notes.setdefault("weight_cap", {})[site] = {"claimed": claimed, "credited": int(count)}
            if ctx.once(("weight cap", site)):
                log.warning("round %d: site %s claims %d of the round's %d training rows; credited %d, so that no "
                            "site holds more than %g of a sample-weighted average (defences.max_share; said once "
                            "per site, every capped round is in metrics.jsonl `weight_cap`)", round_number(r), site, claimed,
                            sum(counts), count, ctx.cfg.defences.max_share)
    return out


def stop_if_majority_refused(ctx: Context, r: int, screened: int, refused: list[str], kept: list[str]) -> None:
    """Stop the run when most replies (of three or more) were refused in this round and the one before.

    One faulty site is a minority, and one bad round (a broken software roll-out, several
    faults at once) can be weathered with ``min_sites``. When the majority is refused round
    after round, the likelier story is that the model they train from was taken over — by an
    update, or a claimed size, that got in earlier — and that the sites still passing are the
    ones it agrees with. Going on would finish the run on the minority's word; stopping names
    them with what the server knows against them (``defences.stop_on_suspect``).
    """
    tally = ctx.screened.setdefault(r, [0, 0])
    tally[0] += screened
    tally[1] += len(refused)
    if not ctx.cfg.defences.stop_on_suspect:
        return
    majority = [q for q in (r - 1, r) if ctx.screened.get(q, [0, 0])[0] >= 3
                and 2 * ctx.screened[q][1] > ctx.screened[q][0]]
    if len(majority) < 2:
        return
    now = sorted({e["site"] for e in ctx.refused if e["round"] == r})
    checks = sorted({e["check"] for e in ctx.refused if e["round"] in majority})
    suspects = "; ".join(_evidence(ctx, site, r) for site in kept) or "none passed"
    raise SuspectSite(
        f"round {round_number(r)}: most replies were refused in rounds {round_number(r - 1)} and "
        f"{round_number(r)} ({tally[1]} of {tally[0]} this round: "
        f"{', '.join(now)}; checks {', '.join(checks)}); when most sites are refused round after round, the model "
        f"they start from may have been taken over by the site{'s' if len(kept) > 1 else ''} whose replies still "
        f"pass — likely culprit: {suspects}. The run stops instead of going on with a minority; check the likely "
        "culprit's installation and claimed size (declare the consortium's sizes: defences.declared_sizes), then "
        "start a new run without it (`sites:`)")


def _evidence(ctx: Context, site: str, r: int) -> str:
    """What the server knows against ``site``: refused before or never, its size against the others'."""
    earlier = [e for e in ctx.refused if e["site"] == site and e["round"] < r]
    parts = [f"refused {len(earlier)} time(s) before" if earlier else "never refused"]
    sizes = _site_sizes(ctx)
    others = [n for s, n in sizes.items() if s != site]
    if site in sizes and others and sizes[site] >= 2 * max(screening.median(others), 1):
        parts.append(f"reports {sizes[site]} training rows, {sizes[site] / max(screening.median(others), 1):.0f}× "
                     "the median of the other sources")
    return f"{site} ({', '.join(parts)})"


def sealed_aggregation(ctx: Context):
    """The transport's secure aggregation (``privacy.secure_aggregation``: replies are ciphertexts the
    server sums but cannot read; :class:`~fedcxr.pipeline.transport.Transport`), or None."""
    return getattr(ctx.transport, "sealed", None)


# --------------------------------------------------------------------------- screening


def screen(ctx: Context, reply: Reply, reference: Optional[StateDict], r: int, *, task: str = "train",
           counted: bool = False) -> Optional[tuple[str, str]]:
    """``(check, reason)`` when ``reply`` must not be aggregated, else ``None``.

    ``check`` is ``counts`` (a claimed count that is not a count, or above what the site
    reported at the start of the run / the steps the task allowed), ``structure`` (keys,
    shapes, dtypes), ``values`` (NaN/Inf, a negative BN variance) or ``norm`` (``‖Δ‖ > norm_limit·‖θ0‖``). The
    relative norm screening needs the round's other replies (:func:`valid_replies`).
    ``counted``: the counts were checked already.
    """
    problem = None if counted else _count_problem(ctx, reply, task)
    if problem:
        return problem
    if reference is None:
        return None
    if reply.params is None:
        return "structure", "no parameters"
    sealed = sealed_aggregation(ctx)
    if sealed is not None:  # ciphertexts: only their structure can be checked (privacy.secure_aggregation)
        reason = sealed.structure_problem(reply.params, reference, ctx.sent.get(reply.site, {}).get("local_keys") or ())
        return ("structure", reason) if reason else None
    reason = _structure_problem(reply.params, reference)
    if reason:
        return "structure", reason
    reason = None if _NORMS.finite(reference, reply.params) else nonfinite_problem(reply.params)
    if reason is None and ctx.cfg.defences.check_variance:
        reason = screening.negative_variance(reply.params)
    if reason:
        return "values", reason
    limit = ctx.cfg.defences.norm_limit
    if limit:
        local = set(ctx.sent.get(reply.site, {}).get("local_keys") or ())
        norm = _NORMS.norm(reference, reply.params, [k for k in _float_keys(reference) if k not in local])
        size = max(_NORMS.reference_norm(reference, exclude=local), 1.0)
        if norm > limit * size:
            return "norm", (f"update norm {norm:.3g} is above {limit:g} × the norm of the model it started from "
                            f"({size:.3g}) (defences.norm_limit)")
    return None


def _count_problem(ctx: Context, reply: Reply, task: str) -> Optional[tuple[str, str]]:
    """A claimed ``n_samples``/``n_batches`` that is not a count, or (``defences.check_counts``)
    more training rows than the site's metadata reported / more steps than the task allowed."""
    check = ctx.cfg.defences.check_counts
    meta = ctx.meta.get(reply.site)
    limit = None
    if check and meta is not None and meta is not reply and task != "evaluate":
        limit = int(meta.n_samples)
    reason = screening.count_problem(reply.n_samples, "n_samples", limit,
                                     "training rows the site reported at the start of the run")
    if reason is None:
        steps = None
        if check and (task == "train" or isinstance(ctx.sent.get(reply.site), TrainTask)):  # a method's too
            steps = screening.planned_steps(ctx.sent.get(reply.site, {}), reply.n_samples)
        reason = screening.count_problem(reply.n_batches, "n_batches", steps, "optimiser steps the task allowed")
    return ("counts", reason) if reason else None


#: each reply's squared entry norms, computed once for both norm checks (:class:`~fedcxr.pipeline.screening.UpdateNorms`)
_NORMS = screening.UpdateNorms()
#: the BatchNorm shifts against one reference, its statistics prepared once (:class:`~fedcxr.pipeline.screening.BnShifts`)
_SHIFTS = screening.BnShifts()


def _float_keys(reference: StateDict) -> list[str]:
    return [k for k, v in reference.items() if v.is_floating_point()]


def _update_keys(ctx: Context, site: str, reference: StateDict) -> list[str]:
    """Entries whose change follows the learning rate: floating, aggregated (not the site's
    local keys), not BatchNorm running statistics (their change does not scale with lr)."""
    local = set(ctx.sent.get(site, {}).get("local_keys") or ())
    return [k for k, v in reference.items() if v.is_floating_point() and k not in local
            and not k.endswith(("running_mean", "running_var"))]


def _step_norm(ctx: Context, reply: Reply, reference: StateDict) -> float:
    """The update norm per optimiser step and unit of lr, over :func:`_update_keys`.

    The steps divided by are the site's claim, but never more than the server planned from the
    size it credits the site with (:func:`credited_rows`): a site cannot shrink its statistic —
    and so pass a larger update — by claiming more rows or more steps."""
    keys = _update_keys(ctx, reply.site, reference)
    norm = _NORMS.norm(reference, reply.params, keys)
    sent = ctx.sent.get(reply.site, {})
    lr = float(sent.get("lr") or 1.0)
    steps = int(reply.n_batches)
    planned = screening.planned_steps(sent, credited_rows(ctx, reply.site))
    return screening.step_norm(norm, lr, steps if planned is None else min(steps, planned))


def _bn_shift(ctx: Context, reply: Reply, reference: StateDict) -> Optional[float]:
    """How far the reply moves the aggregated BatchNorm running statistics (:func:`~fedcxr.pipeline.screening.bn_shift`)."""
    local = ctx.sent.get(reply.site, {}).get("local_keys") or ()
    return _SHIFTS.shift(reference, reply.params, screening.bn_stat_keys(reference, exclude=local))


def _site_sizes(ctx: Context) -> dict[str, int]:
    """Each source's training rows as the server knows them: reported at the start of the run, at most
    its declared size (``defences.declared_sizes``)."""
    declared = ctx.cfg.defences.declared_sizes
    return {s: min(int(ctx.meta[s].n_samples), int(declared.get(s, ctx.meta[s].n_samples)))
            for s in ctx.sources if s in ctx.meta}


def credited_rows(ctx: Context, site: str) -> int:
    """The rows the server plans ``site``'s step budget from (:func:`~fedcxr.pipeline.screening.credited_rows`)."""
    sizes = _site_sizes(ctx)
    if site not in sizes:  # the target, the pooled site: their own report
        meta = ctx.meta.get(site)
        return int(meta.n_samples) if meta is not None else 0
    return screening.credited_rows(sizes, site, ctx.cfg.defences.max_share)


def refuse(ctx: Context, r: int, task: str, site: str, check: str, reason: str) -> None:
    """Record a refused reply (``run.json`` ``refused`` and ``missed``, ``metrics.jsonl``) and log it."""
    log.warning("round %d: rejected update from %s: %s (task %s)", round_number(r), site, reason, task)
    ctx.refused.append({"round": r, "task": task, "site": site, "check": check, "reason": reason})
    ctx.missed.append({"round": r, "task": task, "site": site, "why": "refused", "reason": f"rejected: {reason}"})


def stop_if_suspect(ctx: Context, r: int, failed: list[str]) -> None:
    """Stop the run when sites' updates turn NaN/Inf after another site was refused in an earlier round.

    The pattern of a poisoned model: a site's update got in (or nearly did), the next rounds'
    honest sites diverge and are refused, and the suspect's update would be the only one left.
    Going on would finish the run blaming the honest sites; stopping names the suspect
    (``defences.stop_on_suspect``).
    """
    if not failed or not ctx.cfg.defences.stop_on_suspect:
        return
    earlier = [e for e in ctx.refused if e["round"] < r]
    flagged = {e["site"] for e in earlier}
    honest = sorted(set(failed) - flagged)
    suspects = sorted(flagged - set(failed))
    if not honest or not suspects:
        return
    first = {s: next(e for e in earlier if e["site"] == s) for s in suspects}
    why = "; ".join(f"{s} in round {e['round']} ({e['check']}: {e['reason']})" for s, e in first.items())
    raise SuspectSite(
        f"round {round_number(r)}: the updates of {', '.join(honest)} hold NaN/Inf values after a reply of "
        f"{', '.join(suspects)} was refused ({why}); the global model may carry an earlier update of the "
        f"suspect{'s' if len(suspects) > 1 else ''}: {', '.join(suspects)}. The run stops instead of going on "
        "without the sites that failed; check the suspect's installation and data, then start a new run "
        "without it (`sites:`) or resume once it is fixed")


# --------------------------------------------------------------------------- base protocol


class RoundProtocol:
    """Base: ``init_state`` → ``run_round`` × rounds → ``final_models``.

    A protocol only decides who trains, on what, and which pure rule combines the replies;
    its state is a plain dict of tensors and numbers (checkpointed after every round).
    """

    name = "base"
    needs_target = False
    needs_target_labels = False
    needs_sources = True
    #: AuxInfo (the auxiliary heads' losses) unless ``aux_info`` says: on for the ``_AuxInfo`` methods
    aux_info = False
    #: how the backbone average weights sites unless ``backbone_weighting`` says otherwise: by sample
    #: counts, as the AuxInfo+GP and AutoFedGP code (``clients_size_frac``); the surgical family 1/K
    default_backbone_weighting = "samples"
    #: whether the server averages site models (where ``aggregation.rule`` applies); False: why not
    averages_sites: bool | str = True
    #: What other modules need to know about a method, declared here so that no module outside
    #: ``protocols/`` tests a method's name (DESIGN §1): ``pooled_site`` names a site that holds
    #: every site's training rows in one place (``Central``): the run driver asks it for its
    #: metadata, the in-process transport builds it, and FLARE refuses the method (no hospital
    #: may hold the others' images). ``None`` for every federated method.
    pooled_site: Optional[str] = None
    #: Sites train heads of their own (``FL_Surgical``: the rows of their own classes; ``PFL``: a head
    #: kept at the site), so a reply's head is not an update of the head the server sent: FLARE's
    #: ``percentile_privacy`` filter, which ranks every entry of an update, is refused for them.
    per_site_heads = False
    #: What this method's server reads in one site's own update, so ``privacy.secure_aggregation`` cannot
    #: hide it (a string completing "method X ..."); None where the server needs only a weighted sum
    #: of the sites' models (:meth:`secure_aggregation_problem`).
    reads_each_update: Optional[str] = "reads each site's own update at the server"
    #: Whether a round may ask a share of the sources (``participation.fraction`` < 1, through
    #: :func:`round_sources`); a string completing "method X ..." says why not (README "Running a consortium").
    samples_sources: bool | str = True
    #: Oracle: trains on every labeled target row, so its target budget differs from the other methods'
    #: (the regime map's comparisons leave it out: :mod:`fedcxr.advice.cells`).
    full_target_labels = False
    #: The method's options (docs/methods.md): the config block ``<options_key>: {...}``, validated by
    #: ``Options`` (a :class:`~fedcxr.pipeline.protocols.spec.MethodOptions`); read with :meth:`options`.
    options_key: ClassVar[Optional[str]] = None
    Options: ClassVar[Optional[type]] = None
    #: The site tasks this method sends beyond ``metadata``/``train``/``evaluate``: name →
    #: :class:`~fedcxr.pipeline.site_runner.SiteTask` (handler, config type, flags).
    site_tasks: ClassVar[dict] = {}

    def __init__(self, name: str):
        self.name = name

    def options(self, cfg: ExperimentConfig):
        """This method's options block of ``cfg`` (its defaults when the config leaves it out)."""
        return cfg.options(self.options_key)

    def validate(self, cfg: ExperimentConfig, meta: dict[str, Reply], classes: list[str]) -> None:
        """Refuse option combinations the method cannot use (exit 2, saying why)."""
        if self.needs_target and not cfg.target:
            raise UserError(f"method {self.name} needs a `target:` site")
        if self.needs_target_labels and cfg.target:
            per_class = meta[cfg.site_name(cfg.target)].metrics.get("labeled_per_class", {})
            if sum(per_class.get(c, 0) for c in classes) == 0:
                raise UserError(
                    f"method {self.name} fine-tunes on target labels, but target {cfg.target!r} has no "
                    f"labeled training rows for the model's classes {classes}; use FACT/FACT_NF or "
                    "Source_Only for an unlabeled target"
                )
        if self.needs_sources and not cfg.source_sites():
            raise UserError(f"method {self.name} needs at least one source site in `sites:`")
        self.validate_aggregation(cfg)
        self.validate_secure_aggregation(cfg)
        self.validate_participation(cfg)

    def validate_participation(self, cfg: ExperimentConfig) -> None:
        """``participation.fraction`` < 1 needs a method whose rounds ask a share of the sources (exit 2 saying
        why not)."""
        if cfg.participation.fraction < 1 and self.samples_sources is not True:
            raise UserError(f"participation.fraction {cfg.participation.fraction:g}: method {self.name} "
                            f"{self.samples_sources}; use participation.fraction: 1 (participation.deadline_s and "
                            "min_sites still apply)")

    def secure_aggregation_problem(self, cfg: ExperimentConfig) -> Optional[str]:
        """Why this method cannot run with ``privacy.secure_aggregation`` (None: it can):
        :attr:`reads_each_update` unless a protocol knows more."""
        return self.reads_each_update

    def validate_secure_aggregation(self, cfg: ExperimentConfig) -> None:
        """``privacy.secure_aggregation`` needs a server that only sums (exit 2 saying why not)."""
        mode = cfg.privacy.secure_aggregation
        problem = self.secure_aggregation_problem(cfg) if mode else None
        if problem:
            raise UserError(f"privacy.secure_aggregation: {mode}: method {self.name} {problem}, which an encrypted "
                            "update hides; secure aggregation needs a server that only sums (FedAvg, FedProx, FL and "
                            "their variants: README 'Secure aggregation')")

    def validate_aggregation(self, cfg: ExperimentConfig) -> None:
        """A robust ``aggregation.rule`` needs a server-side average of at least three sites
        (two: the median is their mean, Krum has nothing to compare) — exit 2 saying why."""
        rule = cfg.aggregation
        if rule.rule == "mean":
            return
        if self.averages_sites is not True:
            raise UserError(f"aggregation.rule {rule.rule}: method {self.name} {self.averages_sites}; "
                            "use aggregation.rule: mean (the reply checks of `defences:` still apply)")
        spec = cfg.participation
        n = sample_size(len(cfg.source_sites()), spec.fraction, spec.min_sites)  # the sources a round asks
        if n < 3:
            raise UserError(f"aggregation.rule {rule.rule} needs at least 3 source sites per round ({n} asked: "
                            "`sites:`, `participation:`): with two, no rule can tell which one is wrong (the median "
                            "of two is their mean); use "
                            "aggregation.rule: mean — `defences:` still refuses implausible replies")
        if rule.rule in ("krum", "multi_krum") and n < 2 * rule.byzantine + 3:
            raise UserError(f"aggregation.rule {rule.rule} with byzantine (f) = {rule.byzantine} needs at least "
                            f"2f+3 = {2 * rule.byzantine + 3} source sites per round, {n} asked (`sites:`, "
                            "`participation:`); lower "
                            "aggregation.byzantine")
        if rule.rule == "multi_krum" and rule.select is not None and rule.select > n:
            raise UserError(f"aggregation.select (m) = {rule.select} is more than the {n} source sites")
        if rule.rule == "trimmed_mean" and int(rule.trim * n) == 0:
            raise UserError(f"aggregation.trim {rule.trim:g} of {n} source sites cuts int({rule.trim:g}·{n}) = 0 "
                            f"values from each end: the plain mean; raise trim to at least {1 / n:.3g} or use "
                            "aggregation.rule: median")

    def task_defaults(self) -> dict:
        """The method's values of the local-training settings a config leaves unset: ``optimizer``,
        ``weight_decay``, ``momentum``, ``optimizer_state``, ``target_batch_size``
        (:data:`BASE_TASK_DEFAULTS`, which names the code each follows, overridden per method).

        This and the class attributes beside it (:attr:`aux_info`, :attr:`default_backbone_weighting`;
        GP/FedDA/FedGP's ``default_warmup_rounds`` and ``lr_scale``; FedProx/SCAFFOLD/FedOpt's server
        constants in :mod:`~fedcxr.pipeline.protocols.fedopt`) are the one place a method's defaults are
        set and their sources named; the config's fields point here.
        """
        return dict(BASE_TASK_DEFAULTS)

    def init_state(self, ctx: Context, theta: StateDict) -> dict:
        return {"global": theta, "initial_bn": {k: theta[k].clone() for k in ctx.bn_keys}}

    def run_round(self, ctx: Context, r: int, state: dict) -> tuple[dict, dict]:
        raise NotImplementedError

    def final_models(self, ctx: Context, state: dict) -> dict:
        """``{"global": θ, "per_site": {site: θ_site}}``; per_site may be empty."""
        return {"global": state["global"], "per_site": {}}

    def uniform_backbone(self, ctx: Context) -> bool:
        """True when sites are averaged 1/K (config ``backbone_weighting``, else the method's default)."""
        return (ctx.cfg.backbone_weighting or self.default_backbone_weighting) == "uniform"

    def eval_local_keys(self, ctx: Context) -> list[str]:
        """Keys each site substitutes from its own state at evaluation (FedBN: BN, PFL: head)."""
        return []

    def default_eval_sites(self, ctx: Context) -> list[str]:
        """The target when there is one (an external site for methods that have no target)."""
        return [ctx.target] if ctx.target else list(ctx.sources)


def aggregate_backbone(ctx: Context, replies: dict[str, Reply], theta0: StateDict, *,
                       uniform: bool = False, exclude: tuple[str, ...] = ()) -> StateDict:
    """FedAvg / FedBN / FedBN+ of everything except ``exclude`` (e.g. heads under surgical).

    With a robust ``aggregation.rule`` the same entries go through that rule instead
    (:func:`robust_average`); the mean keeps exactly the FedAvg arithmetic of the papers.
    """
    sites = list(replies)
    states = [{k: v for k, v in replies[s].params.items() if k not in exclude} for s in sites]
    weights = [1.0 if uniform else float(max(replies[s].n_samples, 1)) for s in sites]
    sealed = sealed_aggregation(ctx)
    if sealed is not None:  # privacy.secure_aggregation: the same weighted mean, on ciphertexts
        if exclude:
            raise ValueError(f"entries {list(exclude)[:3]} cannot be left out of a sealed average")
        return sealed.weighted_mean(theta0, dict(zip(sites, states)), weights)
    mode = ctx.cfg.backbone_aggregation
    if ctx.cfg.aggregation.rule != "mean":
        local = set(ctx.bn_keys) if mode != "fedavg" else set()
        merged = robust_average(ctx, sites, [{k: v for k, v in st.items() if k not in local} for st in states],
                                weights, theta0)
    elif mode == "fedavg":
        merged = agg.fedavg(states, weights)
    else:
        merged = agg.fedbn(states, weights, ctx.bn_keys)
    out = dict(theta0)
    out.update(merged)
    return out


#: Robust rules that need three replies: with two, the median is their mean and Krum has nothing to compare.
NEEDS_THREE = ("median", "trimmed_mean", "krum", "multi_krum")


def robust_average(ctx: Context, sites: list[str], states: list[StateDict], weights: list[float],
                   theta0: StateDict) -> StateDict:
    """The config's robust rule (:mod:`fedcxr.pipeline.aggregate`) over the round's screened states.

    What it did goes into the round's metrics (``aggregation``): the sites Krum kept, the
    clipping factors. The rule config validation applies to the ``sites:`` list holds for every
    round's replies too, so a rule never quietly becomes the mean when refusals or absences
    leave fewer (issue 27), each case said in the log and the metrics:

    * fewer than 3 replies under median, trimmed mean or (multi-)Krum: the round fails
      (:class:`RoundFailed`, the run stops with exit 1 and resumes with ``--resume``) — with two,
      no rule can tell which one is wrong, and their mean is what a robust rule was chosen not to be;
    * trimmed mean whose ``int(trim·n)`` is 0 for this round's n: one value is cut from each end
      (the least trimming that still trims; config validation demands at least one of the full list);
    * Krum with fewer than ``2f+3`` replies: f is lowered to what the replies allow (``(n−3)//2``).
    """
    spec = ctx.cfg.aggregation
    note: dict = {"rule": spec.rule}
    n = len(states)
    if spec.rule in NEEDS_THREE and n < 3:
        r = _round_of(ctx, sites)
        log.warning("%s: aggregation.rule %s over %d valid replies (%s) would be their mean; the round fails",
                    r, spec.rule, n, ", ".join(sites))
        raise RoundFailed(f"{r}: aggregation.rule {spec.rule} needs at least 3 valid replies and this round has "
                          f"{n} ({', '.join(sites)}; the others were refused or did not answer: run.json `refused`, "
                          "`missed`); with two, no rule can tell which one is wrong and the rule would be their mean. "
                          "Resume (--resume) once the sites answer, or use aggregation.rule: mean")
    if spec.rule == "median":
        merged = agg.coordinate_median(states)
    elif spec.rule == "trimmed_mean":
        cut = int(spec.trim * n)
        if cut == 0:
            cut = 1
            note["fallback"] = f"int({spec.trim:g}·{n}) = 0 would be the plain mean; cut 1 per side"
            log.warning("%s: aggregation.trim %g of %d valid replies cuts int(%g·%d) = 0 values per side (the "
                        "plain mean); this round cuts 1 per side", _round_of(ctx, sites), spec.trim, n, spec.trim, n)
        # a β with int(β·n) = cut exactly (cut + ¼ keeps float rounding off the boundary)
        merged = agg.trimmed_mean(states, spec.trim if cut == int(spec.trim * n) else (cut + 0.25) / n)
        note["trimmed_per_side"] = cut
    elif spec.rule in ("krum", "multi_krum"):
        f = min(spec.byzantine, (n - 3) // 2)
        if f != spec.byzantine:
            note["byzantine"] = f
            log.warning("aggregation.rule %s: %d valid replies this round, too few for byzantine (f) = %d; f = %d "
                        "this round", spec.rule, n, spec.byzantine, f)
        m = 1 if spec.rule == "krum" else min(spec.select or n - f, n)
        chosen = agg.krum_select(states, f, m)
        note["kept"] = [sites[i] for i in chosen]
        # Krum: the chosen model itself; multi-Krum: the unweighted mean of the chosen (trim 0)
        merged = agg.trimmed_mean([states[i] for i in chosen], 0.0) if len(chosen) > 1 else \
            {k: v.detach().clone() for k, v in states[chosen[0]].items()}
    elif spec.rule == "clip":
        base = {k: theta0[k] for k in states[0]}
        bound, factors = agg.clip_factors(agg.update_norms(base, states), spec.clip_norm)
        note["clip_norm"] = bound
        note["clipped"] = {s: float(f"{f:.4g}") for s, f in zip(sites, factors) if f < 1.0}  # scale applied
        merged = agg.norm_clipped_mean(base, states, weights, bound)
    else:  # pragma: no cover - the config's Literal lists every rule
        raise ValueError(f"unknown aggregation rule {spec.rule!r}")
    ctx.notes.setdefault("aggregation", []).append(note)
    return merged


def _round_of(ctx: Context, sites: list[str]) -> object:
    """``round N`` the sites were last asked for (their task config; N counted from 1), for messages."""
    for site in sites:
        value = (ctx.sent.get(site) or {}).get("round")
        if isinstance(value, int):
            return f"round {round_number(value)}"
    return "round ?"
