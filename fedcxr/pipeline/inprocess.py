"""The in-process transport: every site simulated as a :class:`SiteRunner` in this process.

The default transport of ``fedcxr train`` and of the tests (DESIGN §8): "send this model to
these sites" becomes a method call on each site's runner, one after the other. The sites'
local state (FedBN statistics, PFL heads) is checkpointed with the server's, since both
live in this process. :func:`site_transport` picks it, or the same runners in parallel worker
processes on a CPU (``engine.site_workers``, :mod:`fedcxr.pipeline.site_workers`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Optional

import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.config import ExperimentConfig
from fedcxr.pipeline.data import default_cache_dir
from fedcxr.pipeline.engine import Engine, resolve_engine
from fedcxr.pipeline.model_pool import ModelPool
from fedcxr.pipeline.protocols import get_protocol
from fedcxr.pipeline.protocols.methods import site_tasks
from fedcxr.pipeline.site_runner import SiteRunner, SiteTask, handle_together
from fedcxr.pipeline.transport import Transport

log = logging.getLogger(__name__)


class InProcessTransport(Transport):
    """Every site is a Python object in this process (the default, and the tests' transport)."""

    def __init__(self, runners: Mapping[str, SiteRunner]):
        self.runners = dict(runners)
        self.site_names = list(self.runners)

    def run(self, task, targets, params, config, *, per_site=None):
        """Each site's reply, site after site; when every site is sent the same model and config they
        answer together (:func:`~fedcxr.pipeline.site_runner.handle_together`: validation in one
        pass), with the same replies."""
        if not per_site:
            return handle_together([self.runners[s] for s in targets], task, params, config)
        replies = {}
        for site in targets:
            site_params, site_config = per_site.get(site, (params, config))
            replies[site] = self.runners[site].handle(task, site_params, site_config)
        return replies

    def local_states(self) -> dict[str, dict]:
        return {name: runner.get_local_state() for name, runner in self.runners.items()}

    def load_local_states(self, states: Mapping[str, dict]) -> None:
        for name, state in states.items():
            if name in self.runners:
                self.runners[name].set_local_state(state)


def build_runners(cfg: ExperimentConfig, device: torch.device, progress: bool, *,
                  tasks: Optional[Mapping[str, SiteTask]] = None) -> dict[str, SiteRunner]:
    """One SiteRunner per site of the config, plus the pooled site when the method has one
    (:func:`runner_dirs`).

    They share one :class:`~fedcxr.pipeline.engine.Engine` and one network per layout
    (:class:`~fedcxr.pipeline.model_pool.ModelPool`: each task loads the received model into it),
    so N simulated sites build and hold one network, not N, on the CPU or the GPU. Each answers the
    methods' tasks (:func:`~fedcxr.pipeline.protocols.methods.site_tasks`: every built-in method's
    and the config's own) and ``tasks``, e.g. FLARE's cross-site ``validate`` simulated in-process.
    """
    _warn_filters(cfg)
    common = runner_kwargs(cfg, device, progress, tasks={**site_tasks(cfg.method), **(tasks or {})})
    pool = ModelPool()
    return {name: SiteRunner(name, dirs, **common, pool=pool) for name, dirs in runner_dirs(cfg).items()}


def _warn_filters(cfg: ExperimentConfig) -> None:
    if cfg.privacy.filters:
        log.warning("privacy.filters are NVIDIA FLARE result filters: they act in `fedcxr flare` runs only, "
                    "not in this in-process run")
    if cfg.privacy.secure_aggregation:
        log.warning("privacy.secure_aggregation hides each site's update from a FLARE server: it acts in `fedcxr "
                    "flare` runs only; this in-process run holds every site in one process and averages in the clear")


def runner_dirs(cfg: ExperimentConfig) -> dict[str, Path | list[Path]]:
    """Each runner's name and site folder(s), in the order the runners are built: one per site of
    the config, plus the pooled site when the method has one
    (:attr:`~fedcxr.pipeline.protocols.RoundProtocol.pooled_site`: Central's every site's rows)."""
    dirs: dict[str, Path | list[Path]] = {cfg.site_name(s): cfg.site_dir(s) for s in cfg.all_sites()}
    pooled = get_protocol(cfg.method).pooled_site
    if pooled:
        dirs[pooled] = [cfg.site_dir(s) for s in cfg.all_sites()]
    return dirs


def runner_kwargs(cfg: ExperimentConfig, device: torch.device, progress: bool, *,
                    tasks: Optional[Mapping[str, SiteTask]] = None, engine: Optional[Engine] = None) -> dict:
    """The :class:`SiteRunner` keyword arguments every runner of ``cfg`` shares (``engine``: the
    run's by default). A parallel site worker gets these and its own sites' folders, nothing else."""
    cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    return dict(model_cfg=cfg.model.model_dump(mode="json"), image_size=cfg.image_size, cache_dir=cache,
                device=device, augment=cfg.augment, progress=progress, engine=engine or run_engine(cfg, device),
                task=cfg.task.model_dump(mode="json") if cfg.task else None, tasks=tasks)


def run_engine(cfg: ExperimentConfig, device: torch.device) -> Engine:
    """The experiment's ``engine:`` block and ``num_workers`` resolved for ``device``."""
    return resolve_engine(device, cfg.engine.model_dump(), cfg.num_workers)


def site_transport(cfg: ExperimentConfig, device: torch.device, progress: bool) -> Transport:
    """The simulator of ``fedcxr train``: every site in this process (:class:`InProcessTransport`),
    or, with ``engine.site_workers`` ≥ 2 on a CPU, the round's sites trained at the same time in
    that many worker processes (:class:`~fedcxr.pipeline.site_workers.SiteWorkers`, never more
    than there are sites) — the same replies bit for bit either way. Close it after the run
    (:meth:`~fedcxr.pipeline.transport.Transport.close`)."""
    workers = min(cfg.engine.site_workers, len(runner_dirs(cfg)))
    if workers > 1 and device.type == "cuda":
        log.warning("engine.site_workers: %d is for CPU runs; on %s the sites take turns on the device in this "
                    "process (engine.offload_idle)", cfg.engine.site_workers, device)
    elif workers > 1:
        if run_engine(cfg, device).num_workers > 0:
            raise UserError(f"engine.site_workers: {cfg.engine.site_workers} with num_workers: "
                            f"{run_engine(cfg, device).num_workers}: a site worker process cannot start loader "
                            "processes of its own; set num_workers: 0 or engine.site_workers: 0")
        from fedcxr.pipeline.site_workers import SiteWorkers

        _warn_filters(cfg)
        return SiteWorkers(runner_dirs(cfg), runner_kwargs(cfg, device, False), workers, method=cfg.method)
    return InProcessTransport(build_runners(cfg, device, progress))
