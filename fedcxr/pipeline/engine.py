"""How training uses the hardware: the settings that make a GPU fast and leave results alone.

The experiment's ``engine:`` block (:class:`fedcxr.pipeline.config.EngineConfig`) holds
requests, most of them ``auto`` (``None``); :func:`resolve_engine` turns them into an
:class:`Engine` for one device, with defaults that are right on both:

==================  ======================================  =====================================
setting             on CUDA (auto)                          on CPU (auto)
==================  ======================================  =====================================
``amp``             float16 autocast + GradScaler           off (autocast is CUDA-only here)
``channels_last``   NHWC model and batches (tensor cores)   off (no tensor cores to feed)
``cudnn_benchmark`` on, unless ``deterministic``            not applicable
``num_workers``     min(8, usable cores − 1) loader procs   0 (the main process)
``pin_memory``      on (page-locked batches, async copy)    off
``persistent``      workers started once per run: a site    (only with workers)
                    keeps its training loader and re-seeds
                    it every round
``prefetch``        4 batches per worker                    (only with workers)
``cache_workers``   every usable core decodes the cache     every usable core
``offload_idle``    a site's model moves to CPU between     off (it is already there)
                    its turns, so sites that wait hold no
                    GPU memory
``threads``         1 torch intra-op thread per process     1 (see "Thread policy" below)
==================  ======================================  =====================================

Thread policy. A training or evaluation process uses ``threads`` intra-op threads (auto: 1),
set for the run and restored after (:func:`backend_settings`; a FLARE site process sets it once,
:func:`apply_backend`). Measured on 2 cores (``benchmarks/bench_threads.py``, BENCHMARKS.md):
the tiny networks of 28–64 px images gain nothing from a second thread even on idle cores,
and with other jobs on the machine torch's default (one thread per core) stalls in OpenMP
barriers, several times slower than one thread. One thread is also the one setting that is
the same on every machine, so it keeps a CPU run bit-identical across resumes and hosts of the
same CPU type; set ``threads`` for large images on a machine of your own.

None of these changes which images, augmentations or batches a site sees (the loader's
streams depend only on the seed, the epoch and the item: :mod:`fedcxr.pipeline.data`), so a
run is bit-identical on CPU whatever they are — except ``threads``: float sums are split
across threads, so a CPU run repeats bit for bit only with the same thread count (recorded in
``run.json`` and every checkpoint; ``--resume`` warns when it differs). On CUDA, ``cudnn_benchmark`` picks the fastest
convolution kernels, which are not bit-for-bit reproducible; ``deterministic: true`` turns it
off and asks PyTorch for deterministic algorithms (``CUBLAS_WORKSPACE_CONFIG`` included).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Mapping, Optional

import torch

#: Loader processes used at most by ``num_workers: auto`` on CUDA (more rarely helps one GPU).
MAX_AUTO_WORKERS = 8
#: Batches each loader worker prepares ahead (PyTorch's default is 2).
PREFETCH_FACTOR = 4
#: Torch intra-op threads per training/evaluation process by default (module doc: thread policy).
AUTO_THREADS = 1


@dataclass(frozen=True)
class Engine:
    """Resolved hardware settings for one device (see the module doc)."""

    device: torch.device
    amp: bool
    channels_last: bool
    cudnn_benchmark: bool
    deterministic: bool
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: Optional[int]
    cache_workers: int
    offload_idle: bool
    threads: int = AUTO_THREADS

    def describe(self) -> dict[str, Any]:
        """The settings as plain values (logs, benchmarks)."""
        out = asdict(self)
        out["device"] = str(self.device)
        return out


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask where there is one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_engine(device: torch.device | str, settings: Optional[Mapping[str, Any]] = None,
                   num_workers: Optional[int] = None) -> Engine:
    """The :class:`Engine` for ``device`` from an ``engine:`` mapping (missing/None keys = auto).

    ``num_workers`` (the experiment's top-level key, or a FLARE site's own) wins over auto.
    """
    device = torch.device(device)
    s = dict(settings or {})
    cuda = device.type == "cuda"

    def pick(key: str, auto: Any) -> Any:
        value = s.get(key)
        return auto if value is None else value

    deterministic = bool(pick("deterministic", False))
    workers = num_workers if num_workers is not None else s.get("num_workers")
    if workers is None:
        workers = min(MAX_AUTO_WORKERS, usable_cores() - 1) if cuda else 0
    workers = max(0, int(workers))
    cache_workers = int(pick("cache_workers", 0)) or usable_cores()
    return Engine(
        device=device,
        amp=bool(pick("amp", True)) and cuda,
        channels_last=bool(pick("channels_last", cuda)),
        cudnn_benchmark=bool(pick("cudnn_benchmark", True)) and cuda and not deterministic,
        deterministic=deterministic,
        num_workers=workers,
        pin_memory=bool(pick("pin_memory", cuda)) and cuda,
        persistent_workers=bool(pick("persistent_workers", True)) and workers > 0,
        prefetch_factor=int(pick("prefetch_factor", PREFETCH_FACTOR)) if workers > 0 else None,
        cache_workers=max(1, cache_workers),
        offload_idle=bool(pick("offload_idle", cuda)) and cuda,
        threads=max(1, int(pick("threads", AUTO_THREADS))),
    )


def loader_options(engine: Engine, *, train: bool = True) -> dict[str, Any]:
    """Keyword arguments for :func:`fedcxr.pipeline.data.make_loader` on this engine.

    Prediction loaders (``train=False``) are iterated once, so their workers are not kept.
    ``device``: batches are finished (float, augmentation, normalisation) on the training device.
    """
    options: dict[str, Any] = {"num_workers": engine.num_workers, "pin_memory": engine.pin_memory,
                               "device": engine.device}
    if engine.num_workers > 0:
        options["persistent_workers"] = engine.persistent_workers and train
        options["prefetch_factor"] = engine.prefetch_factor
    return options


def apply_backend(engine: Engine) -> None:
    """Set the thread count, cuDNN autotuning and deterministic algorithms for this process (a
    FLARE site's process holds one site; in-process runs use :func:`backend_settings`, which
    restores them)."""
    torch.set_num_threads(engine.threads)
    cudnn = torch.backends.cudnn
    if engine.device.type == "cuda":
        cudnn.benchmark = engine.cudnn_benchmark
    if engine.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS's first use
        cudnn.benchmark = False
        cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)


@contextlib.contextmanager
def backend_settings(engine: Engine) -> Iterator[None]:
    """Threads, cuDNN autotuning / deterministic algorithms for the duration of a run, restored after.

    These are process-wide switches in PyTorch; restoring them keeps one run (or test) from
    changing the next.
    """
    cudnn = torch.backends.cudnn
    previous = (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                torch.get_num_threads())
    try:
        apply_backend(engine)
        yield
    finally:
        torch.set_num_threads(previous[5])
        cudnn.benchmark, cudnn.deterministic = previous[0], previous[1]
        torch.use_deterministic_algorithms(previous[2], warn_only=previous[3])
        if previous[4] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = previous[4]


def offload(models: Mapping[Any, torch.nn.Module] | list[torch.nn.Module], device: str = "cpu") -> None:
    """Move every model (parameters and buffers) to ``device`` (a site waiting for its next turn)."""
    for model in (models.values() if isinstance(models, Mapping) else models):
        model.to(device)


__all__ = ["Engine", "apply_backend", "backend_settings", "loader_options", "offload", "resolve_engine", "usable_cores"]
