"""Cross-site evaluation on FLARE, server side: after the last round, every site scores the final model.

Follows FLARE's cross-site evaluation conventions (``nvflare.app_common.workflows.
cross_site_model_eval``) where they fit:

* the task is FLARE's validation task, ``validate`` (``AppConstants.TASK_VALIDATION``);
* the global model's owner is named ``SRV_server`` (FLARE's server model name) and a site's own
  model by the site's name;
* the results are also written as FLARE's ``cross_site_val/cross_val_results.json``:
  ``{data site: {model owner: {metric: value}}}``.

Where it does not fit, fedcxr's own flow is kept: the workflow is not FLARE's
``CrossSiteModelEval`` (that one first has every client submit its model with
``submit_model``, then validates every model on every site). Our models already sit on the
server (``final_model.pt``); a site's own model (PFL head, FedBN statistics) is evaluated only
on that site, because it is the model that site deploys, and a site's AUROC is meaningful only
on its own label space. So the controller sends each site its deployed model (the same
parameters ``fedcxr evaluate`` scores it with), and for per-site methods the global model too.

Each site answers with a summary (:mod:`fedcxr.flare.site_evaluation`), checked by
:func:`fedcxr.flare.wire.check_summary` and :func:`fedcxr.evaluation.summary_check.summary_problem`
(which also checks the small-sample flags against the counts); the server writes ``report.json``, ``per_class.csv`` and
``report.md`` with :mod:`fedcxr.evaluation.report_table`. A site that fails, does not answer or
sends a refused reply is named in the report (``sites_without_predictions``) with the reason;
the others are reported.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from fedcxr.atomic import atomic_write_json
from fedcxr.evaluation.report_table import build_summary_report, upgrade_entry, write_summary_report
from fedcxr.evaluation.runs import load_run_info
from fedcxr.evaluation.summary_check import summary_problem
from fedcxr.flare.site_evaluation import VALIDATE_TASK
from fedcxr.pipeline.keys import SEALED_PREFIX
from fedcxr.pipeline.messages import ValidateTask
from fedcxr.pipeline.predictions import load_final, site_params
from fedcxr.pipeline.transport import Transport
from fedcxr.rundir import CROSS_SITE_DIR

log = logging.getLogger(__name__)

#: FLARE's name of the server's (global) model in cross-site evaluation
SERVER_MODEL = "SRV_server"
CROSS_VAL_DIR = CROSS_SITE_DIR  # fedcxr.rundir
CROSS_VAL_FILE = "cross_val_results.json"
DEFAULTS = {"enabled": True, "n_boot": 1000, "split": "test", "seed": 0}


def evaluation_settings(spec: Optional[dict]) -> dict:
    """The job's ``evaluation`` block with defaults (``enabled``, ``n_boot``, ``split``, ``seed``)."""
    out = dict(DEFAULTS)
    out.update({k: v for k, v in (spec or {}).items() if k in DEFAULTS})
    return out


def own_model_sites(final: dict, sites: list[str]) -> list[str]:
    """Sites whose deployed model differs from the global one (per-site heads, local BN statistics)."""
    return [s for s in sites if s in final.get("per_site", {}) or
            (final.get("eval_local_keys") and s in final.get("local_states", {}))]


def _own_params(final: dict, site: str) -> dict:
    """The model ``site`` is scored with (:func:`~fedcxr.pipeline.predictions.site_params`); sealed
    (``privacy.secure_aggregation``): without a model block its own local block covers entirely."""
    params = site_params(final, site)
    if any(str(k).startswith(SEALED_PREFIX) for k in params):
        from fedcxr.flare.secure_aggregation import own_sealed_model

        params = own_sealed_model(params)
    return params


def cross_site_evaluate(transport: Transport, run_dir: Path, settings: dict) -> dict:
    """Ask every evaluated site to score the final model(s); write the report; returns ``report.json``'s dict."""
    run_dir = Path(run_dir)
    run, final = load_final(run_dir, sealed_ok=True)  # privacy.secure_aggregation: the sites open it
    info = load_run_info(run_dir)
    split, n_boot, seed = str(settings["split"]), int(settings["n_boot"]), int(settings["seed"])
    clients = set(getattr(transport, "site_names", []) or [])
    sites = [s for s in run["eval_sites"] if not clients or s in clients]
    failed = {s: "not a client of this FLARE job" for s in run["eval_sites"] if s not in sites}
    base = ValidateTask.build(classes=list(final["classes"]), aux_tasks=list(final.get("aux_tasks") or []),
                              split=split, n_boot=n_boot, seed=seed)
    own = own_model_sites(final, sites)
    per_site = {s: (_own_params(final, s), base.replace(model_owner=s)) for s in own}
    deployed = _ask(transport, sites, final["global"], base.replace(model_owner=SERVER_MODEL), per_site)
    matrix: dict[str, dict[str, Any]] = {}
    summaries: dict[str, dict] = {}
    for site in sites:
        metrics, reason = deployed.get(site, (None, None))
        owner = site if site in own else SERVER_MODEL
        problem = None if reason or metrics.get("summary") is None else summary_problem(metrics["summary"],
                                                                                        list(base.classes))
        if reason:
            failed[site] = reason
        elif metrics.get("summary") is None:
            failed[site] = f"no rows in the {split} split at the site"
        elif problem:
            failed[site] = f"summary refused: {problem}"  # logged below, named in the report
        else:
            summaries[site] = metrics["summary"]
            matrix.setdefault(owner, {})[site] = _cell(metrics)
    if own:  # per-site methods: the global model on those sites too
        extra = _ask(transport, own, final["global"], base.replace(model_owner=SERVER_MODEL), {})
        for site, (metrics, reason) in extra.items():
            if not reason and metrics.get("summary") is not None:
                problem = summary_problem(metrics["summary"], list(base.classes))
                if problem:
                    log.warning("cross-site evaluation: site %s's summary of the global model refused: %s", site,
                                problem)
                    continue
                matrix.setdefault(SERVER_MODEL, {})[site] = _cell(metrics)
    cross = {"convention": "FLARE cross-site evaluation: task 'validate', global model 'SRV_server'",
             "deployed_model": {s: (s if s in own else SERVER_MODEL) for s in sites}, "models": matrix}
    report = build_summary_report(summaries, info, split=split, n_boot=n_boot, seed=seed, failed=failed,
                                  cross_site=cross)
    write_summary_report(run_dir, report)
    write_cross_val_results(run_dir, matrix)
    for site, reason in failed.items():
        log.warning("cross-site evaluation: site %s not reported: %s", site, reason)
    return report


def _ask(transport: Transport, sites: list[str], params, config: ValidateTask,
         per_site: dict) -> dict[str, tuple[Optional[dict], Optional[str]]]:
    """``{site: (metrics, None) | (None, reason)}`` of one ``validate`` task."""
    if not sites:
        return {}
    rejected_before = len(getattr(transport, "rejected", []))
    replies = transport.run(VALIDATE_TASK, sites, params, config, per_site=per_site)
    reasons = {r["site"]: r["reason"] for r in getattr(transport, "rejected", [])[rejected_before:]}
    out: dict[str, tuple[Optional[dict], Optional[str]]] = {}
    for site in sites:
        if site in replies:
            out[site] = (replies[site].metrics or {}, None)
        else:
            why = reasons.get(site) or f"no reply ({transport.absence_reason(site) or 'the site did not answer'})"
            out[site] = (None, f"evaluation failed: {why}")  # e.g. "no reply (disconnected)"
    return out


def _cell(metrics: dict) -> dict:
    """One model × site cell: mean AUROC, rows, class AUROCs and how many classes behind the mean are
    small-sample (:mod:`fedcxr.evaluation.small_sample`; from the flags the site sent, or its counts)."""
    summary = metrics["summary"]
    small = upgrade_entry(summary)["mean_auroc_small_sample_classes"] if "per_class" in summary else []
    return {"mean_auroc": summary.get("mean_auroc"), "n_rows": summary.get("n_rows"),
            "auroc": {r["class"]: r.get("auroc") for r in summary.get("per_class", [])},
            "n_classes": len(summary.get("mean_auroc_classes") or []), "small_sample_classes": len(small)}


def write_cross_val_results(run_dir: Path, matrix: dict[str, dict[str, Any]]) -> Path:
    """FLARE's ``cross_site_val/cross_val_results.json``: ``{data site: {model owner: metrics}}``."""
    by_site: dict[str, dict[str, Any]] = {}
    for owner, cells in matrix.items():
        for site, cell in cells.items():
            by_site.setdefault(site, {})[owner] = {"val_mean_auroc": cell["mean_auroc"], "n": cell["n_rows"],
                                                   "val_small_sample_classes": cell.get("small_sample_classes", 0),
                                                   **{f"val_auroc_{c}": v for c, v in cell["auroc"].items()}}
    path = Path(run_dir) / CROSS_VAL_DIR / CROSS_VAL_FILE
    atomic_write_json(path, _nan_to_none(by_site))
    return path


def _nan_to_none(value):
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return None
    return value
