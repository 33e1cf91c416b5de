"""The FLARE job of a fedcxr run: the controller on the server, the client script on every site.

A job names two fedcxr things only: the controller class (:data:`CONTROLLER_PATH`, with the
fedcxr version that wrote the job, checked when the server starts it) and the client script
(:data:`CLIENT_SCRIPT`, copied into each site's app). Every other module is imported from the
fedcxr installed at the server and at each hospital — except a method of the user's own
(``method: path/to/file.py:Name``): its one file is shipped in every app's custom code (server and
sites) and the job's config names it as ``<file stem>:Name`` (:func:`method_files`), so a site runs
it only where its policy admits the job's custom code (:mod:`fedcxr.flare.client`, SECURITY.md).

``privacy.filters`` of the config become NVFLARE's own result filters in every site's app
(:func:`result_filters`): ``exclude_vars`` → ``nvflare.app_common.filters.ExcludeVars``,
``percentile_privacy`` → ``nvflare.app_common.filters.PercentilePrivacy``, applied in the
given order to the replies that carry model updates (:func:`filtered_tasks`: the tasks whose
:class:`~fedcxr.pipeline.site_runner.SiteTask` says ``filtered``), which then travel as
differences from the received model (:mod:`fedcxr.flare.wire`).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

import fedcxr
from fedcxr.errors import UserError
from fedcxr.flare import TASK_REQUEST_INTERVAL
from fedcxr.flare.controller import CLIENT_NAME, FedcxrController, require_nvflare
from fedcxr.flare.cross_site import evaluation_settings
from fedcxr.flare.liveness import DEAD_CLIENT_SETTINGS
from fedcxr.flare.persistor import LOCATOR_ID, PERSISTOR_ID, FedcxrModelLocator, FedcxrModelPersistor
from fedcxr.pipeline.protocols import CENTRAL_SITE, get_protocol

#: The dotted path FLARE's server configuration names (see ``allow_controller`` in POC mode).
CONTROLLER_PATH = "fedcxr.flare.controller.FedcxrController"
#: The client script's file name inside each site's app.
CLIENT_SCRIPT = "fedcxr_client.py"
#: Where FLARE's TensorBoard receiver writes the sites' streamed scalars (inside the server's job folder).
TB_FOLDER = "tb_events"


def check_flare_sites(cfg) -> list[str]:
    """The config's site names as FLARE client names (refused when FLARE cannot use them); a method
    that cannot run under the config's ``privacy.secure_aggregation`` is refused here, before any job."""
    protocol = get_protocol(cfg.method)
    if protocol.pooled_site:
        raise UserError(f"method {cfg.method} pools every site's images in one place; it cannot run federated "
                        "on FLARE (run it with `fedcxr train`)")
    protocol.validate_secure_aggregation(cfg)
    protocol.validate_participation(cfg)
    if cfg.simulate is not None:
        raise UserError("simulate: runs a consortium on a simulated clock in one process (`fedcxr train`); on FLARE "
                        "the clock and the sites are real: remove `simulate:` (participation.deadline_s bounds each "
                        "round in wall time)")
    sites = [cfg.site_name(s) for s in cfg.all_sites()]
    bad = [s for s in sites if not re.match(CLIENT_NAME, s) or s == CENTRAL_SITE]
    if bad:
        raise UserError(f"site names {bad} cannot be FLARE client names (letters, digits, '-' and '_' only); "
                        "rename the site folders")
    return sites


def client_script_path() -> Path:
    """The client script FLARE copies into each site's app: a two-line entry point.

    It only calls :func:`fedcxr.flare.client.main`, so a job keeps working whatever
    the installed fedcxr's module layout (the job names no other fedcxr module).
    """
    return Path(__file__).with_name(CLIENT_SCRIPT)


def build_job(experiments: list[tuple[Any, str, bool]], *, name: Optional[str] = None, task_timeout: int = 0,
              site_configs: Optional[Mapping[str, Path]] = None, client_script: Optional[Path] = None,
              evaluation: Optional[dict] = None):
    """A FLARE ``FedJob``: the controller on the server, the client script on every site.

    ``experiments``: ``[(ExperimentConfig, server run dir or "", resume)]``; the job's clients are
    the union of their sites. ``site_configs`` (``{site: path of a fedcxr_site.json}``) ships each
    site's own configuration inside its app (simulator and POC on one machine); without it each
    hospital finds its configuration itself (see :mod:`fedcxr.flare.client`). ``evaluation``: the
    cross-site evaluation after the last round (:func:`fedcxr.flare.cross_site.evaluation_settings`).
    """
    require_nvflare()
    from nvflare.app_common.executors.client_api_executor import ClientAPIExecutor
    from nvflare.client.config import ExchangeFormat
    from nvflare.job_config.api import FedJob
    from nvflare.job_config.defs import FilterType

    if not experiments:
        raise ValueError("a FLARE job needs at least one experiment")
    sites = list(dict.fromkeys(s for cfg, _, _ in experiments for s in check_flare_sites(cfg)))
    min_sites = min(cfg.min_sites for cfg, _, _ in experiments)
    job = FedJob(name=name or job_name(experiments[0][0]), min_clients=max(1, min(min_sites, len(sites))))
    job.set_app_packages(["fedcxr"])  # sites import the installed fedcxr; no fedcxr code is copied
    shipped = method_files(cfg for cfg, _, _ in experiments)
    specs = [{"config": {**cfg.model_dump(mode="json"), "method": job_method(cfg.method)}, "run_dir": str(run_dir or ""),
              "resume": bool(resume), "evaluation": evaluation_settings(evaluation)}
             for cfg, run_dir, resume in experiments]
    job.to_server(FedcxrController(experiments=specs, task_timeout=task_timeout, fedcxr_version=fedcxr.__version__))
    job.to_server(FedcxrModelPersistor(), id=PERSISTOR_ID)  # FLARE's tools find the global model through these
    job.to_server(FedcxrModelLocator(), id=LOCATOR_ID)
    # FLARE's dead-client settings (fedcxr.flare.liveness): a client FLARE reports dead is deemed
    # disconnected within seconds, not FLARE's default minute
    job.to({"server": {"task_request_interval": TASK_REQUEST_INTERVAL}, **DEAD_CLIENT_SETTINGS}, "server")
    for path in shipped.values():  # a method of the user's own: the server's app imports it too
        job.add_file_to(str(path), "server")
    streaming = site_tracking_wanted(cfg for cfg, _, _ in experiments)
    if streaming:  # FLARE experiment tracking: the sites' scalars to the server's TensorBoard files
        from nvflare.app_opt.tracking.tb.tb_receiver import TBAnalyticsReceiver

        job.to_server(TBAnalyticsReceiver(tb_folder=TB_FOLDER), id="fedcxr_tb_receiver")
    script = Path(client_script or client_script_path())
    filters = job_filters(experiments)
    filtered = filtered_tasks(cfg for cfg, _, _ in experiments)
    for site in sites:
        # the script travels in the site's app (custom/) and is found there by name: no machine path in the job
        executor = ClientAPIExecutor(execution_mode="in_process", task_script_path=script.name,
                                     params_exchange_format=ExchangeFormat.RAW,
                                     server_expected_format=ExchangeFormat.RAW)
        job.to(executor, site, tasks=["*"])
        for item in result_filters(filters):
            job.to(_exportable(item), site, filter_type=FilterType.TASK_RESULT, tasks=filtered)
        if streaming:
            from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE
            from nvflare.app_common.widgets.convert_to_fed_event import ConvertToFedEvent

            job.to(ConvertToFedEvent(events_to_convert=[ANALYTIC_EVENT_TYPE], fed_event_prefix="fed."), site,
                   id="fedcxr_event_to_fed")
        job.add_file_to(str(script), site)
        for path in shipped.values():
            job.add_file_to(str(path), site)
        if site_configs and site in site_configs:
            job.add_file_to(str(site_configs[site]), site)
    return job


def filtered_tasks(cfgs) -> list[str]:
    """The tasks whose replies carry model updates (``SiteTask.filtered``): the site runner's ``train``,
    every built-in method's, and the experiments' own methods' — what ``privacy.filters`` act on."""
    from fedcxr.pipeline.protocols.methods import site_tasks
    from fedcxr.pipeline.site_runner import TASKS

    names = [name for name, task in TASKS.items() if task.filtered]
    for cfg in cfgs:
        names += [name for name, task in site_tasks(cfg.method).items() if task.filtered]
    return sorted(set(names))


def method_files(cfgs) -> dict[str, Path]:
    """module name → file of each experiment's method from a file (``method: path/to/file.py:Name``),
    shipped in every app's custom code; refused when two experiments' files share a name. A method from
    an installed module (``package.module:Name``) is not shipped: the server and each site install it
    (and a site lists it under ``allow_methods``)."""
    out: dict[str, Path] = {}
    for cfg in cfgs:
        source = cfg.method.rpartition(":")[0]
        if not source.endswith(".py"):
            continue
        path = Path(source).resolve()
        if not path.stem.isidentifier() or path.stem in (Path(CLIENT_SCRIPT).stem, "fedcxr"):
            raise UserError(f"method {cfg.method}: FLARE ships the method as its file {path.name} and imports it as "
                            f"module {path.stem!r}; rename the file to a Python identifier (not fedcxr's names)")
        if path.stem in out and out[path.stem] != path:
            raise UserError(f"methods {out[path.stem]} and {path} of one FLARE job share the module name "
                            f"{path.stem!r}; rename one file")
        out[path.stem] = path
    return out


def job_method(method: str) -> str:
    """The ``method`` a job's config names: as written, except a method from a file, named as
    ``<file stem>:Name`` — the module shipped in the job's custom code (:func:`method_files`)."""
    source, _, name = method.rpartition(":")
    return f"{Path(source).stem}:{name}" if source.endswith(".py") else method


def job_filters(experiments: list) -> list[dict]:
    """The one ``privacy.filters`` list of a job's experiments (filters belong to the sites' apps)."""
    found = {str(cfg.privacy.filters): cfg.privacy.filters for cfg, _, _ in experiments}
    if len(found) > 1:
        raise UserError("privacy.filters differ between the experiments of one FLARE job; the filters are part of "
                        "every site's app: export experiments with different filters as separate jobs")
    filters = next(iter(found.values()))
    for cfg, _, _ in experiments:
        if get_protocol(cfg.method).per_site_heads and any("percentile_privacy" in f for f in filters):
            raise UserError(f"privacy.filters: percentile_privacy needs updates of the shape the server sent, but "
                            f"{cfg.method}'s sites send back heads of their own classes; use exclude_vars "
                            "or another method")
    return filters


def result_filters(filters: list[dict]) -> list:
    """NVFLARE filter objects for ``privacy.filters`` (entries are matched as the wire names them).

    ``exclude_vars``: a list of state-dict entry names, or a regular expression searched in
    each name (a leading ``^`` anchors at the name's start, as written in the config).
    """
    from nvflare.apis.dxo import DataKind
    from nvflare.app_common.filters.exclude_vars import ExcludeVars
    from nvflare.app_common.filters.percentile_privacy import PercentilePrivacy

    from fedcxr.flare.wire import DIFF_PREFIX, PARAM_PREFIX

    prefixes = (DIFF_PREFIX, PARAM_PREFIX)
    out = []
    for item in filters:
        kind, args = next(iter(item.items()))
        if kind == "exclude_vars":
            if isinstance(args, list):
                out.append(ExcludeVars(exclude_vars=[p + name for p in prefixes for name in args]))
            else:
                head = "(?:" + "|".join(re.escape(p) for p in prefixes) + ")"
                body = args[1:] if args.startswith("^") else ".*?(?:" + args + ")"
                out.append(ExcludeVars(exclude_vars=f"^{head}(?:{body})" if args.startswith("^") else f"^{head}{body}"))
        else:
            args = args or {}
            # updates only: on full weights (DataKind.WEIGHTS) it would zero most of a model
            out.append(PercentilePrivacy(percentile=float(args.get("percentile", 10)),
                                         gamma=float(args.get("gamma", 0.01)), data_kinds=[DataKind.WEIGHT_DIFF]))
    return out


def _exportable(item):
    """A copy FLARE's job exporter writes correctly: ``ExcludeVars`` compiles its regular expression
    in ``__init__`` and NVFLARE 2.9 would export the compiled pattern (an empty ``re.Pattern``);
    the site builds the filter again from the exported string."""
    import copy

    if isinstance(getattr(item, "exclude_vars", None), re.Pattern):
        item = copy.copy(item)
        item.exclude_vars = item.exclude_vars.pattern
    return item


def site_tracking_wanted(cfgs) -> bool:
    """Stream the sites' scalars (FLARE experiment tracking) unless every experiment says ``tracking: none``.

    The server writes them with TensorBoard, so it needs it installed: ``tensorboard`` (the
    default when installed) or unset.
    """
    from fedcxr.tracking import default_backend

    return any((cfg.tracking or default_backend()) == "tensorboard" for cfg in cfgs)


def job_name(cfg) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"fedcxr-{cfg.name}-{cfg.method_name}".lower()).strip("-")[:60]


def export_job(experiments: list, job_dir: Path, *, task_timeout: int = 0, site_configs=None,
               client_script: Optional[Path] = None, evaluation: Optional[dict] = None) -> Path:
    """Write the FLARE job folder itself at ``job_dir`` (``nvflare job submit -j JOB_DIR``).

    ``experiments``: ``[(ExperimentConfig, server run dir or "", resume)]``.
    """
    job = build_job(experiments, task_timeout=task_timeout, site_configs=site_configs, client_script=client_script,
                    evaluation=evaluation)
    return write_job_folder(job, job_dir)


def write_job_folder(job, job_dir: Path | str) -> Path:
    """A FLARE ``FedJob`` exported as the folder ``job_dir`` (replaced whole, never merged into an old
    one). FLARE names the folder after the job, so it is exported beside ``job_dir`` and moved."""
    job_dir = Path(job_dir)
    if job_dir.exists():
        shutil.rmtree(job_dir)
    job_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=job_dir.parent) as tmp:
        job.export_job(tmp)
        shutil.move(str(Path(tmp) / job.name), str(job_dir))
    return job_dir
