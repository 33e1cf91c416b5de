"""The in-process transport: every site simulated as a :class:`SiteRunner` in this process.

The default transport of ``fedcxr train`` and of the tests (DESIGN §8): "send this model to
these sites" becomes a method call on each site's runner, one after the other. The sites'
local state (FedBN statistics, PFL heads) is checkpointed with the server's, since both
live in this process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Optional

import torch

from fedcxr.pipeline.config import ExperimentConfig
from fedcxr.pipeline.data import default_cache_dir
from fedcxr.pipeline.engine import Engine, resolve_engine
from fedcxr.pipeline.protocols import get_protocol
from fedcxr.pipeline.site_runner import SiteRunner, SiteTask
from fedcxr.pipeline.transport import Transport

log = logging.getLogger(__name__)


class InProcessTransport(Transport):
    """Every site is a Python object in this process (the default, and the tests' transport)."""

    def __init__(self, runners: Mapping[str, SiteRunner]):
        self.runners = dict(runners)
        self.site_names = list(self.runners)

    def run(self, task, targets, params, config, *, per_site=None):
        replies = {}
        for site in targets:
            site_params, site_config = (per_site or {}).get(site, (params, config))
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
    (:attr:`~fedcxr.pipeline.protocols.RoundProtocol.pooled_site`: Central's every site's rows).

    They share one :class:`~fedcxr.pipeline.engine.Engine`; on CUDA each runner's model leaves
    the GPU after its turn (``engine.offload_idle``), so N simulated sites need one model's
    worth of GPU memory, not N. ``tasks``: tasks beyond the runner's own (:data:`~fedcxr.pipeline.
    site_runner.TASKS`), e.g. FLARE's cross-site ``validate`` simulated in-process.
    """
    if cfg.privacy.filters:
        log.warning("privacy.filters are NVIDIA FLARE result filters: they act in `fedcxr flare` runs only, "
                    "not in this in-process run")
    cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    engine = run_engine(cfg, device)
    common = dict(model_cfg=cfg.model.model_dump(mode="json"), image_size=cfg.image_size, cache_dir=cache,
                  device=device, augment=cfg.augment, progress=progress, engine=engine,
                  task=cfg.task.model_dump(mode="json") if cfg.task else None, tasks=tasks)
    runners = {cfg.site_name(s): SiteRunner(cfg.site_name(s), cfg.site_dir(s), **common) for s in cfg.all_sites()}
    pooled = get_protocol(cfg.method).pooled_site
    if pooled:
        runners[pooled] = SiteRunner(pooled, [cfg.site_dir(s) for s in cfg.all_sites()], **common)
    return runners


def run_engine(cfg: ExperimentConfig, device: torch.device) -> Engine:
    """The experiment's ``engine:`` block and ``num_workers`` resolved for ``device``."""
    return resolve_engine(device, cfg.engine.model_dump(), cfg.num_workers)
