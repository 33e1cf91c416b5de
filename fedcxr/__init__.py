"""fedcxr: federated chest X-ray classification across hospitals without moving images.

Subpackages follow the data's journey (DESIGN §1); imports point down this list, never up:

==================  ==========================================================================
package             what it holds
==================  ==========================================================================
``commands``        what each ``fedcxr`` command parses and prints (reached only from ``cli``)
``workflows``       what each command does, as library functions: the Python API below; the
                    only place training and evaluation meet
``flare``           the same round protocols on NVIDIA FLARE, one client per hospital
``bundle``          a finished run's model as a MONAI bundle MONAI's own runner executes
``stats``           before training: federated statistics, shift diagnosis, method advice
``evaluation``      per-class AUROC with CIs, subgroups, reports, comparisons (no torch)
``pipeline``        data cache, local training, pure aggregation rules, round protocols,
                    the in-process federation, checkpoints, predictions
``synth``           the synthetic hospitals of the demo and the tests (ingested by the real adapters)
``models``          MONAI backbones with class-named main heads and aux heads
``site_adapters``   vendor exports → canonical per-site manifests
``advice``          the regime map (which method wins where) and reading it
``tracking``        per-round scalars to TensorBoard / MLflow
``vocab``, ``atomic``, ``errors``   vocabularies, crash-safe writes, the user-error type
``escape``, ``runlock``, ``yamlfile``  hostile text made safe per format, one process per run
                    directory, bounded YAML reading (SECURITY.md)
``logs``, ``parallel``  the console (one progress-bar policy), chunks of work mapped over worker
                    processes in order with bounded memory (ingest checks, header reads, caching)
``rundir``          the run directory: every file's name, the readers and writers of its
                    plain files (run.json, metrics.jsonl, config.yaml) and its policy (default
                    name, new/resume checks, status, rounds done): ``RunDir``
``wording``         counted nouns in messages and reports ("1 patient", "2 patients")
==================  ==========================================================================

The Python API — the functions the commands call, returning typed results instead of printing
(README: Use fedcxr from Python); bad input raises :class:`fedcxr.errors.UserError`::

    fedcxr.init_study(folder)                                                  -> dict (what was written)
    fedcxr.train(config, out=None, *, resume=False, device=None, **overrides) -> TrainResult
    fedcxr.evaluate(run_dir, *, split="test", bootstrap=1000, cam=0, ...)      -> EvaluateResult
    fedcxr.ingest(source, input_dir, out, *, plan=False, **options)            -> IngestResult
    fedcxr.predict(run_dir, input_dir, out, *, site=None, ...)                 -> PredictResult
    fedcxr.statistics(config, out, *, min_count=5, ...)                        -> StatsResult
    fedcxr.report(run_dirs, out, *, baseline=None)                             -> ComparisonResult
    fedcxr.sweep(config, methods, *, out, seeds=3, ...)                        -> SweepResult

(``fedcxr stats`` the command is ``fedcxr.statistics`` the function; ``fedcxr.stats`` is the
package, callable as the same function.) They are imported on first use (:func:`__getattr__`), so ``import fedcxr`` stays as
cheap as it was: no torch, no pandas until a function runs.
"""

from __future__ import annotations

#: ``typing.TYPE_CHECKING`` without importing typing (a few milliseconds on every ``fedcxr`` start);
#: type checkers treat the name as true
TYPE_CHECKING = False

__version__ = "0.2.0"

#: API name → the workflow module that defines it (fedcxr.workflows)
_API = {
    "init_study": "fedcxr.workflows.init",
    "train": "fedcxr.workflows.train", "TrainResult": "fedcxr.workflows.train",
    "evaluate": "fedcxr.workflows.evaluate", "EvaluateResult": "fedcxr.workflows.evaluate",
    "ingest": "fedcxr.workflows.ingest", "IngestResult": "fedcxr.workflows.ingest",
    "predict": "fedcxr.workflows.predict", "PredictResult": "fedcxr.workflows.predict",
    "statistics": "fedcxr.workflows.stats", "StatsResult": "fedcxr.workflows.stats",
    "report": "fedcxr.workflows.report", "ComparisonResult": "fedcxr.workflows.report",
    "sweep": "fedcxr.workflows.sweep", "SweepResult": "fedcxr.workflows.sweep",
    "RunDir": "fedcxr.rundir", "UserError": "fedcxr.errors", "RunFailed": "fedcxr.errors",
}

__all__ = ["__version__", *_API]

if TYPE_CHECKING:  # what static tools and IDEs follow; at run time __getattr__ imports on first use
    from fedcxr.errors import RunFailed, UserError
    from fedcxr.rundir import RunDir
    from fedcxr.workflows.evaluate import EvaluateResult, evaluate
    from fedcxr.workflows.ingest import IngestResult, ingest
    from fedcxr.workflows.init import init_study
    from fedcxr.workflows.predict import PredictResult, predict
    from fedcxr.workflows.report import ComparisonResult, report
    from fedcxr.workflows.stats import StatsResult, statistics
    from fedcxr.workflows.sweep import SweepResult, sweep
    from fedcxr.workflows.train import TrainResult, train


def __getattr__(name: str) -> object:
    """The API (:data:`_API`), imported when first used (PEP 562)."""
    if name in _API:
        import importlib

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedcxr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
