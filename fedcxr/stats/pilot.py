"""A pilot estimate of the FedGP papers' theory quantities from one short round.

The FedDA/FedGP paper's auto-weighting rests on two numbers per source: the variance σ² of
the target's own mean update (how noisy its few labels make it) and the source's
discrepancy d² from the target direction (for FedGP the part left after projection, τ²d²).
β_i = σ²/(σ² + τ²d²_i) is its answer to "how much should the target trust source i".

This module runs **one round exactly as the auto-weighted FedGP method runs its rounds**
(:data:`fedcxr.pipeline.protocols.target_combine.PILOT_METHOD`) and reads those numbers:
the protocol's own :meth:`~fedcxr.pipeline.protocols.target_combine.TargetCombineProtocol.train_together`
(sources and target train from the same θ0; the target records its per-batch updates), its
``combine_spec``, and :func:`fedcxr.pipeline.combine.auto_estimates` — the estimators and the
step-size alignment auto-weighting uses, nothing re-implemented. Differences from a real
round of that method, stated in the output: it starts from the run's seeded initial model θ0
(not after the warm-up rounds) and at the configured learning rates (no post-warm-up scale).
Only the estimates leave this function; the sites' updates stay in the in-process transport.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Optional

from fedcxr.errors import RunFailed, UserError
from fedcxr.pipeline.config import ExperimentConfig

log = logging.getLogger(__name__)


def pilot_config(cfg: ExperimentConfig, sources: Optional[list[str]] = None) -> ExperimentConfig:
    """The experiment as a one-round run of the pilot's method (auto-weighted FedGP) without warm-up,
    validation or tracking."""
    from fedcxr.pipeline.protocols.methods import option_models
    from fedcxr.pipeline.protocols.target_combine import pilot_settings

    builtin = option_models()  # a method of your own: its options block does not apply to the pilot's
    data = {k: v for k, v in cfg.model_dump(mode="json").items() if k in builtin or k not in option_models(cfg.method)}
    data.update(rounds=1, eval_every=0, select_round="last", tracking="none", eval_sites=None)
    data = pilot_settings(data)
    if sources is not None:
        data["sites"] = list(sources)
    return ExperimentConfig.model_validate(data)


def pilot_estimates(cfg: ExperimentConfig, *, device: Optional[str] = None, progress: bool = False,
                    usable: Optional[list[str]] = None) -> dict[str, Any]:
    """σ², d²_i, τ²d²_i and β_i (FedGP and FedDA rules) from one round; ``status`` says why not.

    ``usable``: the site names whose statistics came through; the pilot leaves the others out
    (a source that failed its statistics would fail its training too).
    """
    if not cfg.target:
        return {"status": "skipped", "reason": "the config names no target"}
    keep = set(usable) if usable is not None else {cfg.site_name(s) for s in cfg.all_sites()}
    if cfg.site_name(cfg.target) not in keep:
        return {"status": "skipped", "reason": f"the target {cfg.site_name(cfg.target)} sent no statistics"}
    sources = [s for s in cfg.source_sites() if cfg.site_name(s) in keep]
    if not sources:
        return {"status": "skipped", "reason": "no source site sent statistics"}
    auto = _runs_auto_weighting(cfg.method)
    notes: list[str] = []
    try:
        with _held_back(notes):
            result = _run(pilot_config(cfg, sources), device=device, progress=progress)
    except (UserError, RunFailed, ValueError, OSError) as exc:
        reason = pilot_note(f"not possible: {exc}", cfg.method_name, auto=auto)
        log.warning("%s", reason)
        return {"status": "unavailable", "reason": reason}
    finally:
        notes[:] = [pilot_note(n, cfg.method_name, auto=auto) for n in notes]
        for note in notes:
            log.warning("%s", note)
    return {**result, "notes": notes} if notes else result


def pilot_note(said: str, method: str, *, auto: bool) -> str:
    """What the pilot's protocol code said, labelled as the pilot's.

    The pilot runs :data:`~fedcxr.pipeline.protocols.target_combine.PILOT_METHOD` whatever the config's
    method; its checks (e.g. "the
    target gives B = 2 batch updates: lower target_train.batch_size") are advice for that
    method. Under a config of another method, following it would change the user's run for
    nothing, so the label says so; under an auto-weighted method it is the user's own advice.
    """
    from fedcxr.pipeline.protocols.target_combine import PILOT_METHOD

    head = f"the pilot round (one {PILOT_METHOD} round that only estimates σ² and β for this report)"
    if auto:
        return f"{head} (this applies to your {method} run too): {said}"
    return (f"{head}: {said} — advice for {PILOT_METHOD}, nothing to change for your {method} run; "
            "the pilot's β readings are rough")


def _runs_auto_weighting(method: str) -> bool:
    """Whether the config's own method is auto-weighted like the pilot (the same checks apply to it)."""
    from fedcxr.pipeline.protocols import get_protocol

    try:
        return bool(getattr(get_protocol(method), "auto", False))
    except UserError:
        return False


@contextlib.contextmanager
def _held_back(notes: list[str]):
    """Hold back the warnings of the protocol code the pilot runs (collected into ``notes`` to be
    re-logged labelled, :func:`pilot_note`): said as they are, they read as advice for the config's
    own method. Logger filters see only their own logger's records, hence the module's logger."""
    from fedcxr.pipeline.protocols import target_combine

    class Hold(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.levelno < logging.WARNING:
                return True
            notes.append(record.getMessage())
            return False

    hold = Hold()
    target_combine.log.addFilter(hold)
    try:
        yield
    finally:
        target_combine.log.removeFilter(hold)


def _run(cfg: ExperimentConfig, *, device: Optional[str], progress: bool) -> dict[str, Any]:
    from fedcxr.pipeline.combine import auto_estimates
    from fedcxr.pipeline.engine import backend_settings
    from fedcxr.pipeline.run_driver import build_context, initial_model
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners, run_engine
    from fedcxr.pipeline.devices import resolve_device
    from fedcxr.pipeline.protocols import get_protocol
    from fedcxr.pipeline.state import delta

    protocol = get_protocol(cfg.method)
    dev = resolve_device(device or cfg.device)
    transport = InProcessTransport(build_runners(cfg, dev, progress))
    with backend_settings(run_engine(cfg, dev)):
        ctx = build_context(cfg, protocol, transport)
        theta0 = initial_model(cfg, ctx)
        replies, target = protocol.train_together(ctx, 0, theta0, protocol.target_config(ctx, 0, 1.0), 1.0)
    if target is None:
        raise RunFailed(f"the target {ctx.target} did not answer its fine-tuning task")
    order = list(replies)
    spec = protocol.combine_spec(ctx, replies, 1.0)
    deltas = [delta(replies[s].params, theta0) for s in order]
    updates = target.extra.get("batch_updates")
    fedgp = auto_estimates(theta0, deltas, {**spec, "rule": "fedgp"}, updates)
    fedda = auto_estimates(theta0, deltas, {**spec, "rule": "fedda"}, updates)
    sigma2 = float(fedgp["sigma2"])
    return {
        "status": "ok", "method": cfg.method_name, "sigma2": sigma2,
        "sources": {site: {"d2": float(fedgp["d2"][i]), "tau2d2": float(fedgp["tau2d2"][i]),
                           "beta_fedgp": float(fedgp["betas"][i]), "beta_fedda": float(fedda["betas"][i]),
                           "tau2d2_over_sigma2": _ratio(fedgp["tau2d2"][i], sigma2),
                           "d2_over_sigma2": _ratio(fedgp["d2"][i], sigma2),
                           "source_steps": int(replies[site].n_batches)}
                    for i, site in enumerate(order)},
        "target": ctx.target, "target_batches": int(updates.shape[0]) if updates is not None else 0,
        "classes": list(ctx.classes),
        "how": ("one round from the run's seeded initial model θ0 at the configured learning rates, the sources "
                f"and the target trained as {cfg.method_name} trains them (no warm-up rounds before it); estimators "
                "and step-size alignment of auto-weighting (fedcxr.pipeline.combine.auto_estimates), each divided "
                "by the number of model entries M"),
    }


def _ratio(a: float, b: float) -> Optional[float]:
    return float(a) / float(b) if b > 0 else None
