"""``fedcxr stats --flare simulate|poc``: FLARE's federated statistics job, run and read back.

The job (:mod:`fedcxr.flare.stats_job`) runs in FLARE's simulator or on a POC system on
loopback (mTLS), with the process control of :mod:`fedcxr.flare.processes` and :mod:`fedcxr.flare.poc` (process tree, clean stop
on Ctrl-C, POC provisioning, log copies, never a key copied). ``OUT/flare/`` keeps the job,
the sites' configurations, FLARE's result file, the logs of every attempt and ``sent/<site>.jsonl``
— each site's own record of what it sent (:class:`fedcxr.flare.stats.SentStatisticsRecorder`).

A production consortium exports the same job (:func:`export_stats_job`) and submits it to its
provisioned system: each hospital then needs ``fedcxr[flare]``, its ``local/fedcxr_site.json``
and ``fedcxr.flare.stats.FedcxrStatistics`` / ``SentStatisticsRecorder`` in its
``class_allow_list`` (the server: ``FedcxrStatisticsController``).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Optional

from fedcxr.errors import UserError
from fedcxr.flare.controller import CLIENT_NAME
from fedcxr.flare.job import write_job_folder
from fedcxr.flare.poc import free_port, keep_user_nvflare_config, poc_system, submit_and_wait, write_project
from fedcxr.flare.processes import copy_logs, next_log_dir, nvflare_env, terminate_as_interrupt
from fedcxr.flare.run import write_site_configs
from fedcxr.flare.simulator import running_simulator, server_app_ended
from fedcxr.flare.stats import SENT_RECORD, FedcxrStatistics
from fedcxr.flare.stats_job import (
    CONTROLLER_PATH,
    OUTPUT,
    RECORDER_PATH,
    STATISTICS_PATH,
    FedcxrStatsJob,
    read_result,
)

log = logging.getLogger(__name__)



def flare_site_names(cfg) -> list[str]:
    """The config's sites as FLARE client names (letters, digits, ``-`` and ``_``)."""
    sites = [cfg.site_name(s) for s in cfg.all_sites()]
    bad = [s for s in sites if not re.match(CLIENT_NAME, s)]
    if bad:
        raise UserError(f"site names {bad} cannot be FLARE client names (letters, digits, '-' and '_' only); "
                        "rename the site folders")
    return sites


def export_stats_job(cfg, options, job_dir: Path, *, site_configs: Optional[dict] = None) -> Path:
    """Write the statistics job folder (``nvflare job submit -j JOB_DIR``)."""
    sites = flare_site_names(cfg)
    generator = FedcxrStatistics(image_size=cfg.image_size, min_count=options.min_count, epsilon=options.epsilon,
                                 build_cache=options.build_cache, headers=options.headers)
    name = re.sub(r"[^a-z0-9-]+", "-", f"fedcxr-stats-{cfg.name}".lower()).strip("-")[:60]
    job = FedcxrStatsJob(name, generator, min_count=options.min_count, sites=sites)
    job.setup_clients(sites)
    for site in sites:
        if site_configs and site in site_configs:
            job.add_file_to(str(site_configs[site]), site)
    return write_job_folder(job, job_dir)


def run_flare_stats(cfg, flare_dir: Path, options, *, mode: str, timeout: Optional[float] = None
                    ) -> tuple[dict[str, dict], dict[str, dict]]:
    """Run the statistics job (``mode``: simulate | poc); returns the sites' payloads and FLARE's sums."""
    sites = flare_site_names(cfg)
    flare_dir = Path(flare_dir).resolve()
    flare_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("result", "sent"):
        shutil.rmtree(flare_dir / stale, ignore_errors=True)
    site_configs = write_site_configs([cfg], flare_dir, device="cpu")
    job_dir = export_stats_job(cfg, options, flare_dir / "job", site_configs=site_configs)
    runner = {"simulate": _simulate, "poc": _poc}[mode]
    output = runner(job_dir, flare_dir, sites, timeout=timeout, progress=options.progress)
    if output is None:
        raise RuntimeError(f"the FLARE statistics job wrote no result (no site sent statistics?); see the logs in "
                           f"{flare_dir / 'logs'}")
    data = json.loads(output.read_text())
    return read_result(data, sites, options.min_count)


def _keep_outputs(workspace: Path, flare_dir: Path) -> Optional[Path]:
    """FLARE's result file and each site's record of what it sent, out of a workspace about to go."""
    kept = None
    for found in workspace.rglob(Path(OUTPUT).name):
        if found.is_file() and found.parent.name == Path(OUTPUT).parent.name:
            kept = flare_dir / "result" / Path(OUTPUT).name
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(found, kept)
    for record in workspace.rglob(SENT_RECORD):
        lines = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
        site = lines[0].get("site") if lines else None
        if site and re.match(CLIENT_NAME, str(site)):
            target = flare_dir / "sent" / f"{site}.jsonl"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(record, target)
    return kept


def _simulate(job_dir: Path, flare_dir: Path, sites: list[str], *, timeout: Optional[float], progress: bool
              ) -> Optional[Path]:
    workspace = flare_dir / "simulator"
    shutil.rmtree(workspace, ignore_errors=True)
    logs = next_log_dir(flare_dir)
    with open(logs / "simulator.log", "w") as out, terminate_as_interrupt():
        try:
            with running_simulator(job_dir, workspace, sites, out, nvflare_env()) as (proc, tree):
                started = time.time()
                while proc.poll() is None and not server_app_ended(workspace):
                    if timeout and time.time() - started > timeout:
                        raise TimeoutError(f"the FLARE statistics job did not finish within {timeout:.0f} s")
                    tree.snapshot()
                    time.sleep(0.5)
        finally:
            copy_logs(workspace, logs)
            kept = _keep_outputs(workspace, flare_dir)
            shutil.rmtree(workspace, ignore_errors=True)
    return kept


def _poc(job_dir: Path, flare_dir: Path, sites: list[str], *, timeout: Optional[float], progress: bool
         ) -> Optional[Path]:
    workspace = flare_dir / "poc"
    shutil.rmtree(workspace, ignore_errors=True)
    env = {**nvflare_env(), "NVFLARE_POC_WORKSPACE": str(workspace)}
    project = write_project(flare_dir / "project.yml", sites, free_port())
    log_path = next_log_dir(flare_dir) / "poc.log"
    # the server builds the statistics controller; the sites build fedcxr's Statistics and recorder
    allow = {"server": (CONTROLLER_PATH,), **{site: (STATISTICS_PATH, RECORDER_PATH) for site in sites}}
    kept = None
    with open(log_path, "w") as out, keep_user_nvflare_config(), terminate_as_interrupt():
        with poc_system(project, workspace, env, out, log_path, allow) as tree:
            try:
                submit_and_wait(job_dir, workspace, flare_dir, [], progress, timeout, tick=tree.snapshot)
            finally:  # before the system's workspace is removed
                kept = _keep_outputs(workspace, flare_dir)
                found = _keep_outputs(flare_dir / "result", flare_dir) if (flare_dir / "result").is_dir() else None
                kept = found or kept
    return kept


__all__ = ["export_stats_job", "flare_site_names", "run_flare_stats"]
