"""Experiment tracking: the per-round numbers of a run as TensorBoard (or MLflow) scalars.

Every round of :func:`fedcxr.pipeline.run_driver.run_experiment` (in-process, and on the FLARE
server, which runs the same loop) hands its ``metrics.jsonl`` row to a :class:`Tracker`:

==============================  =====================================================
tag                             value
==============================  =====================================================
``train/<site>/loss``           the site's mean training loss of the round
``train/<site>/main_loss``      … its finding-label part (AuxInfo: without aux losses)
``train/<site>/aux_loss``       … its auxiliary part (AuxInfo)
``target/loss``                 the target's fine-tuning loss (GP, FedDA, FedGP)
``beta/<site>``                 FedDA/FedGP's β of each source (target_combine)
``combine/<name>/<site>``       GP/FedGP: ``scales`` (s_i), ``kept`` (share of values where
                                c_i > 0), ``cos`` (mean c_i); auto: ``d2``, ``tau2d2``
``combine/sigma2``              auto-weighting: σ² of the target's mean update
``combine/target_batches``      auto-weighting: B, the target's batch updates
``val/<site>/mean_auroc``       validation mean AUROC of the model the site keeps
``val/<site>/auroc/<class>``    … per class
``round/seconds``               wall time of the round
==============================  =====================================================

The step is the round. Tags are built from fixed words, site names and class names only: no
patient id, image path or file name can reach a tracker (:func:`check_tag`).

On FLARE each site also streams its own numbers to the server through FLARE's experiment
tracking (``nvflare.client.tracking.SummaryWriter`` → ``ConvertToFedEvent`` →
``TBAnalyticsReceiver``, see :mod:`fedcxr.flare.job`), which ``fedcxr flare simulate|poc`` copy
to ``RUN_DIR/flare/tensorboard/<site>``. ``tensorboard --logdir RUN_DIR`` shows both.

Backends (config key ``tracking``): ``tensorboard`` (event files under ``RUN_DIR/tensorboard``;
the default when the ``tensorboard`` package is installed), ``mlflow`` (optional extra:
``pip install 'fedcxr[mlflow]'``; one MLflow run per fedcxr run, logged to ``MLFLOW_TRACKING_URI``
or ``RUN_DIR/mlruns``), ``none``.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from fedcxr import rundir
from fedcxr.errors import UserError

log = logging.getLogger(__name__)

BACKENDS = ("none", "tensorboard", "mlflow")
TENSORBOARD_DIR = rundir.TENSORBOARD
MLFLOW_DIR = "mlruns"
#: a tag: words, site and class names joined by "/" (no dots, no path-like parts, no long hex ids)
_TAG = re.compile(r"^[A-Za-z0-9_ ()+.-]+(/[A-Za-z0-9_ ()+.-]+)*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_ ()+.-]|\.{2,}")
_HEX_RUN = re.compile(r"[0-9a-fA-F]{16,}")
_LOSSES = ("loss", "main_loss", "aux_loss")


def default_backend() -> str:
    """``tensorboard`` when it is installed, else ``none``."""
    return "tensorboard" if importlib.util.find_spec("tensorboard") is not None else "none"


def check_tag(tag: str) -> str:
    """A tag made of words, site and class names; :class:`ValueError` for anything path- or id-like."""
    if not _TAG.match(tag) or _HEX_RUN.search(tag) or len(tag) > 200:
        raise ValueError(f"tracking tag {tag!r} is not made of plain names (no paths or ids may be tracked)")
    return tag


def tag(*parts: Any) -> str:
    """Join names into a tag; characters outside plain names (``/``, ``\\``, ``..``) become ``_``."""
    return "/".join(_UNSAFE.sub("_", str(part)) or "_" for part in parts)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy / 0-dim torch scalars
        except (TypeError, ValueError):
            return None
    value = float(value)
    return value if math.isfinite(value) else None


def round_scalars(metrics: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` of one ``metrics.jsonl`` row (see the module table); undefined values are skipped."""
    def emit(name: str, value: Any):
        number = _number(value)
        if number is None:
            return
        try:
            yield check_tag(name), number
        except ValueError as exc:  # never track it, never stop the run for it
            log.warning("%s; not tracked", exc)

    for site, values in (metrics.get("train") or {}).items():
        for key in _LOSSES:
            yield from emit(tag("train", site, key), (values or {}).get(key))
    target = metrics.get("target") or {}
    for key in _LOSSES:
        yield from emit(tag("target", key), target.get(key))
    for site, beta in (metrics.get("betas") or {}).items():
        yield from emit(tag("beta", site), beta)
    for name, value in (metrics.get("combine") or {}).items():
        if isinstance(value, Mapping):
            for site, number in value.items():
                yield from emit(tag("combine", name, site), number)
        else:
            yield from emit(tag("combine", name), value)
    for site, values in (metrics.get("val") or {}).items():
        yield from emit(tag("val", site, "mean_auroc"), (values or {}).get("mean_auroc"))
        for cls, auroc in ((values or {}).get("auroc") or {}).items():
            yield from emit(tag("val", site, "auroc", cls), auroc)
    yield from emit("round/seconds", metrics.get("seconds"))


def site_scalars(prefix: Optional[str], metrics: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` a site streams after a task: its losses (``prefix`` ``train``), its validation
    AUROCs (``val``); no site name: FLARE files them under the sending site. ``prefix`` is what the
    task declares (:attr:`SiteTask.streams <fedcxr.pipeline.site_runner.SiteTask>`; ``None``: nothing)."""
    if prefix not in ("train", "val"):
        return
    row = {"train": {"_": metrics}} if prefix == "train" else {"val": {"_": metrics}}
    for name, value in round_scalars(row):
        if name != "round/seconds":
            yield name.replace(f"{prefix}/_/", f"{prefix}/", 1), value


class Tracker:
    """No tracking (``tracking: none``); the base of the real ones."""

    backend = "none"

    def log_round(self, metrics: Mapping[str, Any]) -> None:
        step = int(metrics.get("round", 0))
        for tag, value in round_scalars(metrics):
            self.scalar(tag, value, step)

    def scalar(self, tag: str, value: float, step: int) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TensorBoardTracker(Tracker):
    """Event files under ``RUN_DIR/tensorboard`` (``tensorboard --logdir RUN_DIR``)."""

    backend = "tensorboard"

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run_dir) / TENSORBOARD_DIR
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, global_step=step)

    def log_round(self, metrics: Mapping[str, Any]) -> None:
        super().log_round(metrics)
        self.writer.flush()  # a run killed later keeps every finished round's scalars

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class MLflowTracker(Tracker):
    """One MLflow run per fedcxr run (``MLFLOW_TRACKING_URI``, else ``RUN_DIR/mlruns``)."""

    backend = "mlflow"

    def __init__(self, run_dir: Path, name: str):
        import os

        import mlflow

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri((Path(run_dir).resolve() / MLFLOW_DIR).as_uri())
        self.run = mlflow.start_run(run_name=name)

    def scalar(self, tag: str, value: float, step: int) -> None:
        # MLflow keys allow "/" but not spaces or parentheses everywhere: keep them readable
        self.mlflow.log_metric(re.sub(r"[^A-Za-z0-9_/.-]", "_", tag), value, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def make_tracker(backend: Optional[str], run_dir: Path, *, name: str = "fedcxr") -> Tracker:
    """The tracker of ``backend`` (None: :func:`default_backend`); a clear error when it is not installed."""
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise UserError(f"tracking: {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "tensorboard":
        if importlib.util.find_spec("tensorboard") is None:
            raise UserError("tracking: tensorboard is not installed (pip install tensorboard, "
                            "or set `tracking: none`)")
        return TensorBoardTracker(run_dir)
    if backend == "mlflow":
        if importlib.util.find_spec("mlflow") is None:
            raise UserError("tracking: mlflow is not installed (pip install 'fedcxr[mlflow]', "
                            "or set `tracking: tensorboard` / `none`)")
        return MLflowTracker(run_dir, name)
    return Tracker()
