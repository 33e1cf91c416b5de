"""The run directory: the name of every file in it, and the readers and writers of its plain files (a leaf).

A run directory is what ``fedcxr train`` (or a FLARE server) writes and what ``evaluate``,
``report``, ``predict``, ``export-bundle`` and a resume read::

    RUN_DIR/config.yaml              CONFIG            the resolved config
    RUN_DIR/run.json                 RUN_INFO          method, seed, target, classes, sites, status, missed
                                                       rounds, refused replies (:func:`read_run_info`)
    RUN_DIR/metrics.jsonl            METRICS           one strict-JSON line per round: per-site training losses,
                                                       val AUROC (:func:`write_metrics`, :func:`read_metrics`)
    RUN_DIR/train.log                TRAIN_LOG         header, one line per round, warnings (pipeline.run_log)
    RUN_DIR/tensorboard/             TENSORBOARD       the same numbers as TensorBoard scalars (fedcxr.tracking)
    RUN_DIR/checkpoints/round_NNNN.pt                  atomic, with a .sha256 beside it; the last two are kept
                                                       (written and read by pipeline.checkpoints)
    RUN_DIR/final_model.pt           FINAL_MODEL       the global model (+ per-site models/state) of the chosen round
    RUN_DIR/predictions/<split>.parquet                prediction tables (``fedcxr evaluate``)
    RUN_DIR/operating_points.json    OPERATING_POINTS  thresholds chosen on validation (``fedcxr predict`` applies them)
    RUN_DIR/report.json|.md, per_class.csv             the evaluation report (fedcxr.evaluation)
    RUN_DIR/cam/                     CAM               opt-in Grad-CAM overlays (patient pixels: never shared)
    RUN_DIR/.fedcxr.lock             LOCK              one process per run directory (fedcxr.runlock)
    RUN_DIR/flare_status.json        FLARE_STATUS      a FLARE run's status (fedcxr.flare.controller)
    RUN_DIR/cross_site_val/          CROSS_SITE_DIR    FLARE's cross-site evaluation results
    RUN_DIR/flare/                   FLARE_WORKSPACE   the FLARE job, workspace and logs of ``fedcxr flare``
    RUN_DIR/cross_site_report/       CROSS_SITE_REPORT a FLARE cross-site report moved aside by
                                                       ``fedcxr evaluate --replace-cross-site``

Every module that knows a run directory takes the names from here (:class:`RunDir` gives the
paths), so the layout is written down once. :class:`RunDir` also owns the run directory's
**policy**: the default name of a new run (:meth:`RunDir.default_for`), what a new run or a
resume may start in (:meth:`RunDir.check_start`), whether a folder to read is there at all
(:meth:`RunDir.existing`), the run's status (:meth:`RunDir.status`, :meth:`RunDir.finished`) and
how many rounds it recorded (:meth:`RunDir.rounds_done`). Callers pass a :class:`RunDir` around,
not a path (it is a path-like: ``os.fspath`` and ``Path(run)`` give its root). This module knows JSON, YAML text and strict-JSON
lines; the tensor files are :mod:`fedcxr.pipeline.checkpoints`' (torch, checksums), which only
asks their paths from here. It imports the L1 leaves :mod:`fedcxr.atomic` and
:mod:`fedcxr.errors` only, so ``evaluation/`` (which never imports ``pipeline/``) reads run
directories through it as well. No file named here may hold a patient identifier or an image
path (SECURITY.md).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

from fedcxr.atomic import atomic_write_bytes, atomic_write_json, json_safe
from fedcxr.errors import UserError

log = logging.getLogger(__name__)

CONFIG = "config.yaml"
RUN_INFO = "run.json"
METRICS = "metrics.jsonl"
TRAIN_LOG = "train.log"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
#: a round's checkpoint file inside :data:`CHECKPOINTS` (``round_0003.pt``) and the pattern that finds them all
CHECKPOINT_NAME, CHECKPOINT_GLOB = "round_{:04d}.pt", "round_*.pt"
FINAL_MODEL = "final_model.pt"
PREDICTIONS = "predictions"
OPERATING_POINTS = "operating_points.json"
REPORT_JSON, REPORT_MD, PER_CLASS_CSV = "report.json", "report.md", "per_class.csv"
#: the report's training-curve figure (per-round losses and validation AUROC from :data:`METRICS`)
CURVES_FIGURE = "training_curves.png"
CAM = "cam"
LOCK = ".fedcxr.lock"
FLARE_STATUS = "flare_status.json"
CROSS_SITE_DIR = "cross_site_val"
FLARE_WORKSPACE = "flare"
#: where ``fedcxr evaluate --replace-cross-site`` moves a FLARE run's cross-site report before writing its own
CROSS_SITE_REPORT = "cross_site_report"


class RunDir:
    """One run directory: the paths of its files (nothing is read or created by the paths), and the
    policy every command, the API and FLARE apply to it (the methods below)."""

    def __init__(self, root: "RunDir | Path | str"):
        self.root = Path(root)

    @classmethod
    def of(cls, where: "RunDir | Path | str") -> "RunDir":
        """``where`` as a :class:`RunDir` (the same object when it already is one)."""
        return where if isinstance(where, RunDir) else cls(where)

    @classmethod
    def default_for(cls, cfg: Any, *, flare: bool = False) -> "RunDir":
        """Where a run goes when no ``--out`` is given: ``runs/<name>-<method>-seed<seed>`` (``-flare``
        appended for a FLARE run, so the in-process and the FLARE run of one config sit side by side)."""
        return cls(Path("runs") / f"{cfg.name}-{cfg.method_name}-seed{cfg.seed}{'-flare' if flare else ''}")

    @classmethod
    def existing(cls, where: "RunDir | Path | str") -> "RunDir":
        """A run directory to read (evaluate, report, predict): :class:`UserError` when it is not a folder."""
        run = cls.of(where)
        if not run.root.exists():
            raise UserError(f"{run.root}: no such run directory")
        if not run.root.is_dir():
            raise UserError(f"{run.root}: not a directory (expected a run directory)")
        return run

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def __str__(self) -> str:
        return str(self.root)

    def __fspath__(self) -> str:
        return str(self.root)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    config = property(lambda self: self.root / CONFIG)
    run_info = property(lambda self: self.root / RUN_INFO)
    metrics = property(lambda self: self.root / METRICS)
    train_log = property(lambda self: self.root / TRAIN_LOG)
    tensorboard = property(lambda self: self.root / TENSORBOARD)
    checkpoints = property(lambda self: self.root / CHECKPOINTS)
    final_model = property(lambda self: self.root / FINAL_MODEL)
    operating_points = property(lambda self: self.root / OPERATING_POINTS)
    report_json = property(lambda self: self.root / REPORT_JSON)
    report_md = property(lambda self: self.root / REPORT_MD)
    per_class_csv = property(lambda self: self.root / PER_CLASS_CSV)
    cam = property(lambda self: self.root / CAM)
    lock = property(lambda self: self.root / LOCK)
    flare_status = property(lambda self: self.root / FLARE_STATUS)
    cross_site = property(lambda self: self.root / CROSS_SITE_DIR)
    flare_workspace = property(lambda self: self.root / FLARE_WORKSPACE)
    cross_site_report = property(lambda self: self.root / CROSS_SITE_REPORT)

    def checkpoint(self, r: int) -> Path:
        """``checkpoints/round_NNNN.pt`` of round ``r`` (0-based)."""
        return self.checkpoints / CHECKPOINT_NAME.format(int(r))

    def checkpoint_files(self) -> list[Path]:
        """The round checkpoints there are, oldest first."""
        return sorted(self.checkpoints.glob(CHECKPOINT_GLOB))

    def predictions(self, split: str) -> Path:
        """``predictions/<split>.parquet``."""
        return self.root / PREDICTIONS / f"{split}.parquet"

    # ----------------------------------------------------------------------- policy

    def check_start(self, *, resume: bool) -> Optional[dict]:
        """What this folder allows a training run (``fedcxr train``, ``fedcxr flare``, the API), decided
        before any site is asked anything: a new run needs a folder without a finished run or
        checkpoints (:class:`UserError` otherwise: nothing is overwritten by accident); ``resume`` on a
        finished run gets its ``run.json`` back (nothing to do); anything else returns None (train,
        or resume from the last checkpoint)."""
        if resume:
            return self.finished()
        if self.final_model.exists():
            raise UserError(f"{self.root} already holds a finished run; choose another --out (or evaluate it: "
                            f"fedcxr evaluate {self.root})")
        if self.checkpoint_files():
            raise UserError(f"{self.root} holds checkpoints of an earlier run; pass --resume to continue it")
        return None

    def finished(self) -> Optional[dict]:
        """``run.json`` of a run that ended (status finished, ``final_model.pt`` written), else None."""
        if not self.final_model.is_file():
            return None
        try:
            info = read_run_info(self.root)
        except (OSError, UserError):
            return None
        return info if info.get("status") == "finished" else None

    def status(self) -> Optional[str]:
        """``run.json``'s status (``running``, ``stopped``, ``finished``); None when there is no readable
        ``run.json`` (a new folder, or a run stopped before its first round)."""
        try:
            return read_run_info(self.root).get("status")
        except (OSError, UserError):
            return None

    def mark_stopped(self) -> None:
        """Record in ``run.json`` that a running run stopped (Ctrl-C, SIGTERM): its status says so, not
        "running" (a finished run, or a folder without ``run.json``, is left as it is)."""
        try:
            info = read_run_info(self.root)
        except (OSError, UserError):
            return
        if info.get("status") == "running":
            write_run_info(self.root, {**info, "status": "stopped"})

    def rounds_checkpointed(self) -> int:
        """Rounds a resume continues after: the newest checkpoint's round + 1 (0 when there is none)."""
        files = self.checkpoint_files()
        if not files:
            return 0
        try:
            return int(files[-1].stem.rsplit("_", 1)[-1]) + 1
        except ValueError:
            return 0

    def rounds_done(self) -> int:
        """Rounds recorded in ``metrics.jsonl`` so far (its non-empty lines; 0 when absent): the progress
        of a running run (FLARE's bar), and where a stopped one stopped."""
        if not self.metrics.is_file():
            return 0
        text = self.metrics.read_text(encoding="utf-8", errors="replace")
        return sum(1 for line in text.splitlines() if line.strip())


# --------------------------------------------------------------------------- config.yaml and run.json


def write_config(run_dir: Path | str, text: str) -> Path:
    """``config.yaml`` (the resolved config as YAML text), atomically."""
    path = RunDir(run_dir).config
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


def write_run_info(run_dir: Path | str, payload: dict) -> Path:
    """``run.json``, atomically (strict JSON: NaN/Inf as null)."""
    path = RunDir(run_dir).run_info
    atomic_write_json(path, payload)
    return path


def read_run_info(run_dir: Path | str) -> dict[str, Any]:
    """``run.json`` as a dict; :class:`UserError` naming the file when it is missing, not JSON or
    not an object (the keys a reader needs are the reader's to check: ``evaluation.runs.load_run_info``)."""
    run_dir = Path(run_dir)
    path = RunDir(run_dir).run_info
    if not path.is_file():
        raise UserError(f"{run_dir}: no {RUN_INFO}, so this is not a fedcxr run directory (`fedcxr train` writes one)")
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(info, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(info).__name__}")
    return info


def finished_run(run_dir: "RunDir | Path | str") -> Optional[dict]:
    """``run.json`` of a run that ended, else None (:meth:`RunDir.finished`)."""
    return RunDir.of(run_dir).finished()


# --------------------------------------------------------------------------- metrics.jsonl


def _plain(value: Any) -> Any:
    """Arrays and tensors as lists (anything with ``tolist``), containers walked (the rest is
    :func:`fedcxr.atomic.json_safe`'s)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def metrics_line(row: dict) -> str:
    """One round as strict JSON (NaN/Inf → null, tensors → lists): any JSON reader parses it."""
    return json.dumps(json_safe(_plain(row)), allow_nan=False, default=str)


def write_metrics(run_dir: Path | str, rows: list[dict]) -> Path:
    """``metrics.jsonl`` rewritten whole, atomically, every round: a kill or a full disk mid-write leaves
    the previous complete file, never a torn line (a few KB per round: cheap)."""
    path = RunDir(run_dir).metrics
    atomic_write_bytes(path, "".join(metrics_line(row) + "\n" for row in rows).encode("utf-8"))
    return path


def read_metrics(run_dir: Path | str, *, skip_bad: bool = False) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` ([] when absent).

    A line that is not a JSON object is a :class:`UserError` naming the file and line, or with
    ``skip_bad`` (a resume: a write cut short) dropped with a warning.
    """
    path = RunDir(run_dir).metrics
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            problem = None if isinstance(row, dict) else "is not a JSON object"
        except ValueError as exc:
            row, problem = None, f"is not valid JSON ({exc.__class__.__name__})"
        if problem is None:
            rows.append(row)
        elif skip_bad:
            log.warning("%s line %d %s (a write cut short?): dropped", path, number, problem)
        else:
            raise UserError(f"{path}: line {number} {problem}")
    return rows
