"""Cross-site evaluation at a hospital: the FLARE ``validate`` task (DESIGN §8).

After the last round the server sends each site the model to evaluate (the final global model,
and for per-site methods — PFL heads, FedBN statistics — the site's own model). The site scores
its own ``split`` (default ``test``) where its images are and answers with **summaries only**:
per class AUROC with patient-bootstrap CI, n, positives, prevalence, the small-sample flag and the
interval's method (:mod:`fedcxr.evaluation.small_sample`: counts only); the mean AUROC; subgroup
AUROCs (sex, age bin, race; groups under :data:`~fedcxr.evaluation.report.MIN_SUBGROUP_ROWS`
rows are named as skipped) and calibration summaries — the ``sites`` entry of ``report.json``,
computed by the same :mod:`fedcxr.evaluation.report` functions ``fedcxr evaluate`` uses.

No prediction, row, patient key, id or path leaves the site: the prediction table lives in
memory here, and the reply passes :func:`fedcxr.flare.wire.check_summary` before it is sent
(the server checks it again). The patient bootstrap resamples the site's own pseudonymous
patient ids, which never leave it.

Task config (:class:`~fedcxr.pipeline.messages.ValidateTask`, built by :mod:`fedcxr.flare.cross_site`):
``classes``, ``aux_tasks``, ``split``, ``n_boot``, ``seed`` and ``model_owner`` (FLARE's name of whose
model this is: ``SRV_server`` for the global model, the site's name for its own). The params are
the full state dict.
"""

from __future__ import annotations

import logging
from typing import Optional

import pandas as pd

from fedcxr.flare.wire import check_summary
from fedcxr.pipeline.predictions import site_prediction_frame
from fedcxr.pipeline.messages import Reply, StateDict, ValidateTask
from fedcxr.pipeline.site_runner import SiteRunner, SiteTask

log = logging.getLogger(__name__)

#: FLARE's name of the cross-site validation task (``AppConstants.TASK_VALIDATION``).
VALIDATE_TASK = "validate"


def site_predictions(runner: SiteRunner, params: StateDict, classes: list[str], aux_tasks: list[str],
                     split: str) -> pd.DataFrame:
    """The site's prediction table for ``split`` (in memory only: it never leaves the site);
    the same rows ``fedcxr evaluate`` scores (:func:`fedcxr.pipeline.predictions.site_prediction_frame`)."""
    return site_prediction_frame(runner, params, classes, aux_tasks, split)


def summarize(frame: pd.DataFrame, classes: list[str], *, split: str, n_boot: int, seed: int) -> dict:
    """The ``report.json`` site entry of a prediction table (no keys, no rows)."""
    # imported here, not with the module: SciPy and scikit-learn cost a site's process 1-2 s before its
    # first task (the client imports this module); fedcxr.flare.warm_up imports them while the site waits
    from fedcxr.evaluation import calibration
    from fedcxr.evaluation.report import evaluate_rows, is_binary_task, subgroup_analysis

    binary = is_binary_task(classes)
    entry = evaluate_rows(frame, classes, n_boot=n_boot, seed=seed, split=split, binary=binary)
    entry["subgroups"] = subgroup_analysis(frame, classes, n_boot=n_boot, seed=seed, split=split, binary=binary)
    entry["calibration"] = calibration.calibration_summary(frame, classes, split=split)
    return entry


def validate(runner: SiteRunner, params: Optional[StateDict], task: ValidateTask) -> Reply:
    """Evaluate the received model on this site's split; reply with the summary in ``metrics``."""
    if params is None:
        raise ValueError("validate needs the model to evaluate")
    classes, aux_tasks, split, owner = list(task.classes), list(task.aux_tasks), task.split, task.model_owner
    frame = site_predictions(runner, params, classes, aux_tasks, split)
    metrics: dict = {"split": split, "model_owner": owner, "n": int(len(frame))}
    if len(frame):
        metrics["summary"] = summarize(frame, classes, split=split, n_boot=task.n_boot, seed=task.seed)
    check_summary(metrics)  # a summary that could leak is never sent (the server checks again)
    log.info("site %s: evaluated %s's model on %d %s images", runner.name, owner or "the", len(frame), split)
    return Reply(site=runner.name, n_samples=len(frame), class_set=classes, metrics=metrics)


#: The task this module adds to a FLARE client's runners (``SiteRunner(tasks=...)``): it only reads.
SITE_TASKS = {VALIDATE_TASK: SiteTask(validate, changes_state=False)}
