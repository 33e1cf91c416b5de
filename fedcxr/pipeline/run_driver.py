"""The run driver: one experiment's rounds, whatever carries the tasks to the sites (DESIGN §7, §8).

:func:`run_experiment` is the loop every fedcxr training runs — ``fedcxr train`` with the
in-process transport (every site simulated in this process: :mod:`fedcxr.pipeline.inprocess`)
and a FLARE server with its own (:mod:`fedcxr.flare.controller`): it asks every site for its
metadata, validates the method's options, builds θ0, runs the method's protocol round by round
(:mod:`fedcxr.pipeline.protocols`), validates, checkpoints after every round, resumes, and
writes the run directory (:mod:`fedcxr.rundir` names its files): ``config.yaml``, ``run.json``,
``metrics.jsonl``, ``train.log``, ``tensorboard/``, ``checkpoints/``, ``final_model.pt`` (the
last round's models, or the best validation round's with ``select_round: best_val``).

Only tensors, numbers, class names and pseudonymous counts are written there: no patient
identifier and no image path (SECURITY.md). Resume checks every site's manifest hash against
the one recorded when the run started, and falls back to the previous checkpoint when the
newest is damaged (:mod:`fedcxr.pipeline.checkpoints`).

Every random draw is derived from (seed, round, site, task), and Adam restarts every round as
in the papers, so a run killed after round r and resumed with ``--resume`` ends with exactly
the weights of an uninterrupted run.

(It was called ``federation``; :mod:`fedcxr.pipeline.federation` is that name kept for scripts.)
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

import fedcxr
from fedcxr.errors import RunFailed, UserError
from fedcxr.logs import bar_disabled
from fedcxr.pipeline.checkpoints import load_latest_intact, save_checkpoint, save_final
from fedcxr.pipeline.config import ExperimentConfig, config_fingerprint, dump_config
from fedcxr.pipeline.dp_ledger import ledger_for
from fedcxr.pipeline.engine import backend_settings, resolve_engine
from fedcxr.pipeline.inprocess import run_engine, site_transport
from fedcxr.pipeline.devices import resolve_device
from fedcxr.pipeline.messages import EvaluateTask, NoConfig, StateDict
from fedcxr.pipeline.protocols import Context, RoundProtocol, get_protocol
from fedcxr.pipeline.run_log import round_line, round_number, rounds_log, run_log
from fedcxr.pipeline.screening import count_problem, refusal_pattern, size_problem
from fedcxr.pipeline.keys import PRIVATE_PREFIXES, derive_seed
from fedcxr.pipeline.simulated_consortium import clock_record, simulated
from fedcxr.pipeline.transport import Transport
from fedcxr.rundir import RunDir, read_metrics, write_config, write_metrics, write_run_info
from fedcxr.runlock import run_lock
from fedcxr.vocab import CLASSES
from fedcxr.tracking import make_tracker

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- setup


def head_classes(cfg: ExperimentConfig, meta: dict) -> list[str]:
    """The global head's classes: explicit, the target's, or the union of the sites'."""
    if cfg.model.classes:
        return [c for c in CLASSES if c in cfg.model.classes]
    target = cfg.site_name(cfg.target) if cfg.target else None
    if cfg.class_source == "target" and target:
        wanted = set(meta[target].class_set)
    elif cfg.class_source == "sources":
        wanted = {c for s in cfg.source_sites() for c in meta[cfg.site_name(s)].class_set}
    else:
        wanted = {c for s in cfg.all_sites() for c in meta[cfg.site_name(s)].class_set}
    classes = [c for c in CLASSES if c in wanted]
    if not classes and cfg.class_source == "target" and target and not meta[target].class_set:
        raise UserError(f"no class to train: target {cfg.target!r} is unlabeled and `class_source: target` takes "
                        "the head's classes from it; set `class_source: sources` (FACT/FACT_NF) or `model.classes`")
    if not classes:
        raise UserError("no class to train: the chosen sites label no class in common with `class_source`")
    return classes


def refuse_unlabeled_sources(cfg: ExperimentConfig, meta: dict) -> None:
    """A source must be labeled: an unlabeled site (ingested without labels) only as FACT's target."""
    unlabeled = [s for s in cfg.source_sites() if not meta[cfg.site_name(s)].class_set]
    if unlabeled:
        raise UserError(
            f"source site(s) {unlabeled} have no finding labels (unlabeled sites, ingested without labels); "
            "a source must be labeled: ingest it with --labels FILE.csv, use it as the unlabeled `target:` "
            "of FACT/FACT_NF, or score it with `fedcxr predict`"
        )


def build_context(cfg: ExperimentConfig, protocol: RoundProtocol, transport: Transport) -> Context:
    sites = [cfg.site_name(s) for s in cfg.all_sites()]
    meta = transport.run("metadata", sites, None, NoConfig())
    missing = [s for s in sites if s not in meta]
    if missing:
        raise UserError(f"sites did not answer the metadata query: {missing}")
    check_metadata_counts(meta, cfg.defences.declared_sizes)
    refuse_unlabeled_sources(cfg, meta)
    classes = head_classes(cfg, meta)
    protocol.validate(cfg, meta, classes)
    aux_on = protocol.aux_info if cfg.aux_info is None else cfg.aux_info
    if protocol.pooled_site:  # Central: the site holding every site's rows answers for itself
        pooled = protocol.pooled_site
        meta[pooled] = transport.run("metadata", [pooled], None, NoConfig())[pooled]
    return Context(
        cfg=cfg, transport=transport, meta=meta, classes=classes,
        aux_tasks=list(cfg.aux_tasks) if aux_on else [],
        sources=[cfg.site_name(s) for s in cfg.source_sites()],
        target=cfg.site_name(cfg.target) if cfg.target else None,
        task_defaults=protocol.task_defaults(),
    )


def check_metadata_counts(meta: dict, declared: Optional[dict] = None) -> None:
    """Every site's metadata counts must be plain non-negative integers (later replies are judged
    against them), its training rows at most :data:`~fedcxr.pipeline.screening.MAX_SITE_ROWS` and
    at most the consortium's declared size for it (``defences.declared_sizes``): anything else
    stops the run before round 0, naming the site (exit 2)."""
    for site, reply in meta.items():
        counts = {"n_samples": reply.n_samples, **{k: reply.metrics.get(k) for k in ("n_train", "n_val", "n_test")
                                                   if k in reply.metrics}}
        for what, value in counts.items():
            problem = count_problem(value, what)
            if problem:
                raise UserError(f"site {site} answered the metadata query with {problem}; a site's counts must be "
                                "its manifest's row counts (is it running fedcxr of this version?)")
        problem = size_problem(reply.n_samples, (declared or {}).get(site))
        if problem:
            raise UserError(f"site {site} answered the metadata query with {problem}; its training rows weight it in "
                            "every sample-weighted average and set its step budget, so the run does not start on "
                            "its word (check the site's manifest, or correct defences.declared_sizes)")


def initial_model(cfg: ExperimentConfig, ctx: Context) -> StateDict:
    """θ0 of round 0, seeded; records BN and head keys on the context."""
    from fedcxr.models.network import bn_keys, head_keys, network_from_config
    from fedcxr.vocab import AUX_VOCAB

    torch.manual_seed(derive_seed(cfg.seed, "init"))
    model = network_from_config(ctx.classes, cfg.model.model_dump(), {t: len(AUX_VOCAB[t]) for t in ctx.aux_tasks})
    ctx.bn_keys = list(bn_keys(model))
    ctx.head_keys = list(head_keys(model))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- the run


def run_experiment(cfg: ExperimentConfig, run_dir: RunDir | Path | str, *, resume: bool = False,
                   device: Optional[str] = None, progress: bool = True,
                   transport: Optional[Transport] = None) -> dict:
    """Run (or resume) one experiment; returns the run.json payload.

    ``transport`` defaults to the in-process simulation of every site; the FLARE controller
    passes its own, so both run exactly this loop. What the run directory holds is checked
    first, before any site is asked anything (:meth:`fedcxr.rundir.RunDir.check_start`): a finished
    run is refused at once, and ``resume`` on a finished run returns its ``run.json`` without
    touching a file.
    """
    run_dir = RunDir.of(run_dir).root
    protocol = get_protocol(cfg.method)
    if transport is not None:  # FLARE: the runner that started the job holds the run directory's lock
        return _start(cfg, run_dir, protocol, transport, resume=resume, device=device, progress=progress)
    with run_lock(run_dir, "fedcxr train"):  # one process per run directory (fedcxr.runlock)
        return _start(cfg, run_dir, protocol, None, resume=resume, device=device, progress=progress)


def _start(cfg: ExperimentConfig, run_dir: Path, protocol: RoundProtocol, transport: Optional[Transport], *,
           resume: bool, device: Optional[str], progress: bool) -> dict:
    """Check the run directory, open ``train.log``, and run in-process (no ``transport``) or through it."""
    finished = RunDir(run_dir).check_start(resume=resume)  # the run directory's policy: fedcxr.rundir
    if finished is not None:
        log.info("%s is finished (%s rounds); nothing to resume, no file changed", run_dir, finished.get("rounds"))
        return finished
    with run_log(run_dir):
        rounds_log.info("fedcxr %s: %s, %d rounds; sources %s; target %s; run directory %s", fedcxr.__version__,
                        protocol.name, cfg.rounds, ", ".join(cfg.site_name(s) for s in cfg.source_sites()) or "none",
                        cfg.site_name(cfg.target) if cfg.target else "none", run_dir)
        dev = resolve_device(device or cfg.device)
        ours = transport is None  # ours is closed after the run (no site worker outlives it); FLARE's stays open
        if cfg.simulate is not None and not ours:
            raise UserError("simulate: simulates a consortium's clock in one process; this run's sites are real "
                            "(FLARE): remove `simulate:`")
        if ours and cfg.participation.deadline_s is not None and cfg.simulate is None:
            log.warning("participation.deadline_s bounds a round in wall time on FLARE and on the simulated clock of "
                        "`simulate:` in-process; this in-process run has no `simulate:` block, so no site is late")
        if ours:
            transport = site_transport(cfg, dev, progress)  # sites in this process, or engine.site_workers processes
        # threads, cuDNN autotuning / deterministic kernels, restored after; on a FLARE server too: its
        # aggregation and GP projections sum in the same order as in-process only with the same threads
        closing = contextlib.closing(transport) if ours else contextlib.nullcontext()
        with backend_settings(run_engine(cfg, dev)), closing:
            return _run(cfg, run_dir, protocol, transport, resume=resume, progress=progress)


def _run(cfg: ExperimentConfig, run_dir: Path, protocol: RoundProtocol, transport: Transport, *,
         resume: bool, progress: bool) -> dict:
    transport, ledger = ledger_for(cfg, transport)  # privacy.dp: each site's ε over the rounds
    transport = simulated(cfg, transport)  # simulate: the sites on a virtual clock (a late site's ε is spent)
    ctx = build_context(cfg, protocol, transport)
    theta = initial_model(cfg, ctx)
    state, start, history, best = protocol.init_state(ctx, theta), 0, [], None
    fingerprint = config_fingerprint(cfg)
    hashes = data_hashes(ctx)
    threads = run_threads(cfg)
    if resume:
        state, start, history, best = _resume(run_dir, fingerprint, hashes, transport, ctx, state, threads)
        if ledger is not None:
            ledger.history = _resumed_dp(run_dir, start)
    else:
        RunDir(run_dir).metrics.unlink(missing_ok=True)
    _write_run_files(run_dir, cfg, ctx, protocol, status="running", rounds_done=start)
    tracker = make_tracker(cfg.tracking, run_dir, name=f"{cfg.name}-{cfg.method_name}-seed{cfg.seed}")
    bar = tqdm(range(start, cfg.rounds), desc=f"{protocol.name} rounds", unit="round",
               disable=bar_disabled(progress), initial=start, total=cfg.rounds)
    for r in bar:
        t0 = time.perf_counter()
        try:
            state, metrics = protocol.run_round(ctx, r, state)
        except RunFailed:  # the refusals and absences of the failed round stay on record in run.json
            _write_run_files(run_dir, cfg, ctx, protocol, status="stopped", rounds_done=r + 1, history=history)
            raise
        metrics = {"round": r, **metrics, **_round_record(ctx, r), **clock_record(transport, r, history),
                   "val": _validate(ctx, protocol, state, r)}
        metrics["seconds"] = round(time.perf_counter() - t0, 3)
        best = _keep_best(cfg, best, r, metrics["val"], state, transport)
        history.append(metrics)
        write_metrics(run_dir, history)
        tracker.log_round(metrics)
        # the bar on a terminal shows the round; in a log file (nohup, SLURM) this line does
        rounds_log.info("%s", round_line(metrics, cfg.rounds), extra={"console": bool(bar.disable)})
        save_checkpoint(run_dir, r, {
            "round": r, "fingerprint": fingerprint, "data_hashes": hashes, "threads": threads, "state": state,
            "missed": ctx.missed, "refused": ctx.refused, "local_states": transport.local_states(),
            "classes": ctx.classes,
            **({"dp_history": ledger.history} if ledger is not None else {}),
            **({"best": best} if best is not None else {}),
        })
        bar.set_postfix(_postfix(metrics))
    tracker.close()
    if cfg.select_round == "best_val" and best is None:
        log.warning("select_round: best_val found no validation AUROC in any round (validation splits without "
                    "both classes?): final_model.pt holds the last round")
    chosen = best or {"state": state, "local_states": model_states(transport)}
    final = protocol.final_models(ctx, chosen["state"])
    save_final(run_dir, {
        "global": final["global"], "per_site": final["per_site"], "local_states": chosen["local_states"],
        "eval_local_keys": protocol.eval_local_keys(ctx), "classes": ctx.classes, "aux_tasks": ctx.aux_tasks,
        "model": cfg.model.model_dump(mode="json"), "image_size": cfg.image_size,
    })
    payload = _write_run_files(run_dir, cfg, ctx, protocol, status="finished", ledger=ledger, rounds_done=cfg.rounds,
                               selected={"round": best["round"], "val_auroc": best["score"]} if best else None,
                               history=history)
    rounds_log.info("finished: final_model.pt holds round %d of %d", round_number(best["round"] if best else cfg.rounds - 1),
                    cfg.rounds, extra={"console": False})
    return payload


def _round_record(ctx: Context, r: int) -> dict:
    """What the defences, a robust rule and participation did this round, for ``metrics.jsonl`` (empty
    when nothing): ``missed`` maps every asked site that took no part to why (:func:`missed_map`)."""
    out = {}
    missed = missed_map(ctx.missed, r)
    if missed:
        out["missed"] = missed
    refused = [e for e in ctx.refused if e["round"] == r]
    if refused:
        out["refused"] = refused
    pattern = refusal_pattern(ctx.refused, ctx.sources, range(r + 1))
    if pattern:
        out["refusal_pattern"] = pattern
        if ctx.once(("refusal pattern", tuple(pattern["always_refused"]), tuple(pattern["never_refused"]))):
            log.warning("round %d: %s refused in every round so far while %s never were (a lone faulty site, or — "
                        "when the refused are the majority — a model taken over by one that passes)", round_number(r),
                        ", ".join(pattern["always_refused"]), ", ".join(pattern["never_refused"]))
    if ctx.notes:
        out.update(ctx.notes)
        ctx.notes = {}
    return out


def missed_map(missed: list[dict], r: int) -> dict[str, dict]:
    """``{site: {"why", "task", "reason"}}`` of round ``r``: each asked site that took no part and why
    (``late``, ``dropped``, ``error``, ``refused``, ``no reply``; the first task it missed)."""
    out: dict[str, dict] = {}
    for e in missed:
        if e.get("round") == r and e.get("site") not in out:
            why = e.get("why") or ("refused" if str(e.get("reason", "")).startswith("rejected") else "no reply")
            out[e["site"]] = {"why": why, "task": e.get("task"), "reason": e.get("reason") or why}
    return out


def _keep_best(cfg: ExperimentConfig, best: Optional[dict], r: int, val: dict, state: dict,
               transport: Transport) -> Optional[dict]:
    """``select_round: best_val``: this round's models when their mean validation AUROC beats the best so far.

    The copy holds the protocol state and the sites' model entries (FedBN's BN, PFL's heads) of that
    round; it is checkpointed, so a resumed run selects exactly as an uninterrupted one."""
    if cfg.select_round != "best_val":
        return None
    scores = [float(v["mean_auroc"]) for v in val.values() if v.get("mean_auroc") is not None
              and math.isfinite(float(v["mean_auroc"]))]  # a val split with one class only has no AUROC
    if not scores:
        return best
    score = float(sum(scores) / len(scores))
    if best is not None and score <= best["score"]:
        return best
    return {"round": r, "score": score, "state": _clone(state), "local_states": _clone(model_states(transport))}


def _clone(tree):
    """Deep copy of nested dicts/lists of tensors (the next round's training must not change the kept copy)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _clone(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_clone(v) for v in tree)
    return tree


def _resumed_dp(run_dir: Path, start: int) -> dict:
    """The DP spending recorded up to the checkpoint a resume continues from (plain lists)."""
    found = load_latest_intact(run_dir) if start else None
    return {site: [list(c) for c in calls] for site, calls in ((found[1].get("dp_history") or {}) if found
                                                                else {}).items()}


def model_states(transport: Transport) -> dict[str, dict]:
    """The sites' local state without optimiser moments or SCAFFOLD's c_i (evaluation needs only the model's entries)."""
    return {site: {k: v for k, v in state.items() if not k.startswith(PRIVATE_PREFIXES)}
            for site, state in transport.local_states().items()}


def data_hashes(ctx: Context) -> dict[str, str]:
    """Each site's manifest content hash, as its metadata reply reported it (no data, no ids)."""
    return {site: str(reply.metrics.get("manifest_hash", "")) for site, reply in sorted(ctx.meta.items())}


def run_threads(cfg: ExperimentConfig) -> int:
    """Torch threads each training process of this run uses (``engine.threads``; auto: 1).

    Recorded in ``run.json`` and every checkpoint: on a CPU, the same run repeats bit for bit
    only with the same count (float sums are split across threads)."""
    return resolve_engine("cpu", cfg.engine.model_dump()).threads


def _resume(run_dir: Path, fingerprint: str, hashes: dict[str, str], transport: Transport, ctx: Context,
            state: dict, threads: Optional[int] = None):
    """State after the newest intact checkpoint; refuses a changed config or re-ingested sites,
    and warns when the thread count differs from the one the checkpoint was trained with."""
    found = load_latest_intact(run_dir)
    if found is None:
        log.info("no checkpoint in %s: starting from round 1", run_dir)
        return state, 0, [], None
    path, ckpt = found
    if ckpt["fingerprint"] != fingerprint:
        raise UserError(f"{run_dir}: the config differs from the one this run was started with; "
                        "resume needs the same config (use a new --out for a new run)")
    recorded = ckpt.get("data_hashes") or {}
    changed = sorted(s for s in hashes if s in recorded and recorded[s] != hashes[s])
    if changed:
        raise UserError(f"{run_dir}: site(s) {changed} were re-ingested since this run started (their manifests "
                        "changed); resuming would mix two versions of the data — start a new run with a new --out")
    recorded_threads = ckpt.get("threads")
    if threads is not None and recorded_threads is not None and int(recorded_threads) != int(threads):
        log.warning("%s: this run trained with %d torch thread(s) per process and resumes with %d; it continues, "
                    "but on a CPU the result will differ in the last bits from an uninterrupted run (set "
                    "`engine.threads: %d` to resume bit-identically)", run_dir, int(recorded_threads), int(threads),
                    int(recorded_threads))
    transport.load_local_states(ckpt.get("local_states", {}))
    ctx.missed[:] = ckpt.get("missed", [])
    ctx.refused[:] = ckpt.get("refused", [])
    history = _read_metrics(run_dir, upto=ckpt["round"])
    log.info("resuming %s after round %d (%s)", run_dir, round_number(ckpt["round"]), path.name)
    return ckpt["state"], ckpt["round"] + 1, history, ckpt.get("best")


def _validate(ctx: Context, protocol: RoundProtocol, state: dict, r: int) -> dict:
    cfg = ctx.cfg
    if not cfg.eval_every or (r + 1) % cfg.eval_every and r != cfg.rounds - 1:
        return {}
    models = protocol.final_models(ctx, state)
    sites = eval_sites(ctx, protocol)
    config = EvaluateTask.build(head_classes=ctx.classes, param_classes=ctx.classes, aux_tasks=ctx.aux_tasks,
                                split="val", local_keys=protocol.eval_local_keys(ctx))
    # one request to all evaluated sites (FLARE runs them at once), each with the model it keeps
    per_site = {s: (models["per_site"][s], config) for s in sites if s in models["per_site"]}
    replies = ctx.transport.run("evaluate", sites, models["global"], config, per_site=per_site or None)
    return {
        site: {"mean_auroc": rep.metrics.get("mean_auroc"), "auroc": rep.metrics.get("auroc", {}),
               "n": rep.metrics.get("n"), **({"cases": rep.metrics["cases"]} if "cases" in rep.metrics else {})}
        for site, rep in replies.items()
    }


def eval_sites(ctx: Context, protocol: RoundProtocol) -> list[str]:
    if ctx.cfg.eval_sites:
        return [ctx.cfg.site_name(s) for s in ctx.cfg.eval_sites]
    return protocol.default_eval_sites(ctx)


def _postfix(metrics: dict) -> dict:
    val = [v.get("mean_auroc") for v in metrics.get("val", {}).values() if v.get("mean_auroc") is not None]
    return {"val_auroc": f"{val[0]:.3f}"} if val else {}


def _read_metrics(run_dir: Path, upto: int) -> list[dict]:
    """Metrics of rounds ≤ ``upto`` (a line written after the last checkpoint, or one that does not
    parse, is dropped); the file is rewritten atomically with what is kept."""
    rows = [row for row in read_metrics(run_dir, skip_bad=True)
            if isinstance(row.get("round"), int) and row["round"] <= upto]
    write_metrics(run_dir, rows)
    return rows


def _write_run_files(run_dir: Path, cfg: ExperimentConfig, ctx: Context, protocol: RoundProtocol, *,
                     status: str, ledger=None, selected: Optional[dict] = None, rounds_done: int = 0,
                     history: Optional[list] = None) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, dump_config(cfg))
    payload = {
        "method": protocol.name, "seed": cfg.seed, "target": ctx.target, "classes": ctx.classes,
        "aux_tasks": ctx.aux_tasks, "sites": [cfg.site_name(s) for s in cfg.all_sites()],
        "site_dirs": {cfg.site_name(s): str(cfg.site_dir(s).resolve()) for s in cfg.all_sites()},
        "sources": ctx.sources, "eval_sites": eval_sites(ctx, protocol), "rounds": cfg.rounds, "status": status,
        "missed": ctx.missed, "refused": ctx.refused,
        "refusal_pattern": refusal_pattern(ctx.refused, ctx.sources, range(rounds_done)),
        "class_sets": {s: ctx.meta[s].class_set for s in ctx.meta},
        "n_train": {s: ctx.meta[s].metrics.get("n_train") for s in ctx.meta},
        "config": cfg.model_dump(mode="json"), "fingerprint": config_fingerprint(cfg),
        "data_hashes": data_hashes(ctx), "threads": run_threads(cfg),
    }
    if ledger is not None:
        payload["dp"] = ledger.report()
    if selected is not None:  # select_round: best_val — the round final_model.pt holds
        payload["selected_round"] = selected
    clock = [row["simulated"] for row in history or [] if isinstance(row.get("simulated"), dict)]
    if clock:  # simulate: the run on its virtual clock
        payload["simulated"] = {"clock_s": clock[-1]["clock_s"], "round_s": [c["round_s"] for c in clock],
                                "deadline_s": cfg.participation.deadline_s}
    write_run_info(run_dir, payload)
    return payload
