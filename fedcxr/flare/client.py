"""The hospital's side of a FLARE run: a Client API script around :class:`SiteRunner` (DESIGN §8).

FLARE runs the job's client script (:mod:`fedcxr.flare.fedcxr_client`, which calls
:func:`main`) once per client job. It loops
``flare.receive()`` → :meth:`SiteRunner.handle` → ``flare.send(FLModel(...))``; the training
code is the same :mod:`fedcxr.pipeline.local` every in-process run uses. Only parameters,
counts, class names and metrics leave the site (:mod:`fedcxr.flare.wire` checks the
format); a task that fails is answered with the exception's type name only, the traceback
stays in this site's log.

Where a site finds its data — its **own** configuration, first found wins:

1. ``--site-config PATH`` (script argument),
2. the environment variable ``FEDCXR_SITE_CONFIG``,
3. ``fedcxr_site.json`` beside the client script (a job written by ``fedcxr flare simulate|poc``
   ships one per site app),
4. ``local/fedcxr_site.json`` in the client's workspace (the hospital's startup kit: the
   production place, written by the hospital's admin).

The file is JSON (or YAML), either for this site alone or ``{"sites": {"<name>": {...}}}``::

    {"manifest_dir": "/data/fedcxr/manifests/hospital_a",   # folder with manifest.parquet + site.json
     "cache_dir": "/data/fedcxr/cache",                     # optional: decoded-image cache
     "device": "cuda",                                      # optional: auto | cpu | cuda
     "num_workers": 4,                                      # optional: data-loader workers
     "state_dir": "/data/fedcxr/flare_state",               # optional: local state for resume
     "secure_aggregation": "he"}                            # optional: never send a model in the clear

Secure aggregation (``privacy.secure_aggregation: he``, :mod:`fedcxr.flare.sealing`): a task whose
``seal`` is ``he`` is answered with every model sealed under the site's key (the
``client_context.tenseal`` of its FLARE startup kit); sealed models the server sends are opened
with the same key before the task runs. With ``"secure_aggregation": "he"`` in its own
configuration a site refuses any task that would send a model in the clear, whatever the job says.

Relative paths resolve against the file's folder. Local state (FedBN's BN statistics, PFL's
heads, kept optimiser state, SCAFFOLD's control variate c_i) is saved after every training round under ``state_dir/<run fingerprint>/`` so a
restarted client (after a server resume) continues from the right round.

**Which code a site runs** (SECURITY.md, "Methods from files"): the tasks of fedcxr's own methods,
and of the experiment's method when it is one of the user's own only if this site allowed it
(:func:`site_method`): a module shipped in the job's own custom code (its file in this app's
``custom/`` folder, which FLARE deploys only where the site's policy allows custom code), or a module
the hospital installed and listed in its site configuration (``"allow_methods": ["package.module"]``).
A path, or a module found anywhere else, named by the server's config is refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from fedcxr.atomic import atomic_torch_save
from fedcxr.flare.site_evaluation import SITE_TASKS as EVALUATION_TASKS
from fedcxr.pipeline.checkpoints import load_tensors
from fedcxr.pipeline.data import default_cache_dir
from fedcxr.pipeline.engine import apply_backend, resolve_engine
from fedcxr.pipeline.devices import resolve_device
from fedcxr.pipeline.messages import DELTAS, Reply, TaskConfig, parse_task_config
from fedcxr.pipeline.keys import PRIVATE_PREFIXES
from fedcxr.pipeline.run_log import round_number
from fedcxr.pipeline.site_runner import SiteRunner

log = logging.getLogger(__name__)

SITE_CONFIG_ENV = "FEDCXR_SITE_CONFIG"
SITE_CONFIG_NAME = "fedcxr_site.json"
LOCAL_SITE_CONFIG = Path("local") / SITE_CONFIG_NAME
#: the tasks a FLARE client answers beyond the runner's own and the methods' (:func:`~fedcxr.pipeline.
#: protocols.methods.site_tasks`): cross-site evaluation (``local_state`` is answered by :class:`FlareSite`
#: itself). After a task whose :class:`~fedcxr.pipeline.site_runner.SiteTask` ``changes_state`` the site's
#: local state (FedBN statistics, PFL heads, warmed-up head, optimiser state, SCAFFOLD's c_i, a personal
#: model) is saved for a resume.
CLIENT_TASKS = dict(EVALUATION_TASKS)
KEEP_STATES = 3


@dataclass
class SiteConfig:
    """One hospital's own settings (never sent anywhere)."""

    manifest_dir: Path
    cache_dir: Optional[Path] = None
    device: Optional[str] = None
    num_workers: Optional[int] = None
    state_dir: Optional[Path] = None
    secure_aggregation: Optional[str] = None  # "he": this site sends models sealed only
    source: str = ""
    #: modules of methods the hospital installed and lets the server name (``method: package.module:Name``)
    allow_methods: tuple[str, ...] = ()


def find_site_config(explicit: Optional[str], script_dir: Optional[Path], workspace: Path) -> Path:
    """The first site configuration found (see the module docstring for the order)."""
    candidates = [
        ("--site-config", Path(explicit) if explicit else None),
        (SITE_CONFIG_ENV, Path(os.environ[SITE_CONFIG_ENV]) if os.environ.get(SITE_CONFIG_ENV) else None),
        ("beside the client script", script_dir / SITE_CONFIG_NAME if script_dir else None),
        ("client workspace", workspace / LOCAL_SITE_CONFIG),
    ]
    for where, path in candidates:
        if path is None:
            continue
        if path.is_file():
            return path
        if where in ("--site-config", SITE_CONFIG_ENV):
            raise FileNotFoundError(f"site config {path} (from {where}) does not exist")
    raise FileNotFoundError(
        f"no fedcxr site configuration: pass --site-config, set {SITE_CONFIG_ENV}, or write "
        f"{workspace / LOCAL_SITE_CONFIG} with at least {{\"manifest_dir\": ...}}"
    )


def load_site_config(path: Path, site: str) -> SiteConfig:
    """Read ``path``; pick this site's block when the file lists several sites."""
    import yaml

    text = Path(path).read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    if "sites" in data:
        if site not in (data["sites"] or {}):
            raise ValueError(f"{path}: no entry for site {site!r} under 'sites' (has {sorted(data['sites'])})")
        data = data["sites"][site]
    known = {"manifest_dir", "cache_dir", "device", "num_workers", "state_dir", "secure_aggregation", "allow_methods"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
    if not data.get("manifest_dir"):
        raise ValueError(f"{path}: 'manifest_dir' is required (the folder holding this site's manifest.parquet)")
    if data.get("secure_aggregation") not in (None, "he"):
        raise ValueError(f"{path}: 'secure_aggregation' is \"he\" or absent")
    allow = data.get("allow_methods") or []
    if not isinstance(allow, list) or not all(isinstance(m, str) and m and all(p.isidentifier() for p in m.split("."))
                                              for m in allow):
        raise ValueError(f"{path}: 'allow_methods' is a list of module names (package.module)")

    def resolve(value):
        if value in (None, ""):
            return None
        p = Path(os.path.expanduser(str(value)))
        return p if p.is_absolute() else (Path(path).parent / p).resolve()

    return SiteConfig(
        manifest_dir=resolve(data["manifest_dir"]), cache_dir=resolve(data.get("cache_dir")),
        device=data.get("device"), num_workers=data.get("num_workers"), state_dir=resolve(data.get("state_dir")),
        secure_aggregation=data.get("secure_aggregation"), source=str(path), allow_methods=tuple(allow),
    )


def site_method(reference: Optional[str], custom_dir: Optional[Path], allow: tuple[str, ...] = ()):
    """The method the server's runner settings name, loaded only as this site allows (module docstring):
    ``None`` for a built-in method (their tasks are fedcxr's own), else its
    :class:`~fedcxr.pipeline.protocols.spec.Method`; ``PermissionError`` naming the rule otherwise."""
    import importlib

    from fedcxr.pipeline.protocols.methods import is_reference, load_module, method_in

    if not reference or not is_reference(reference):
        return None  # fedcxr's own methods: nothing to load
    source, _, name = reference.rpartition(":")
    if source in allow:
        return method_in(importlib.import_module(source), name, reference)
    rule = ("this site runs fedcxr's methods, methods shipped in the job's custom code, and the modules its "
            "fedcxr_site.json lists under allow_methods")
    if not source.isidentifier():
        raise PermissionError(f"the server names method {reference[:200]!r}; {rule}")
    shipped = Path(custom_dir) / f"{source}.py" if custom_dir is not None else None
    if shipped is None or not shipped.is_file():
        raise PermissionError(f"the server names method {reference[:200]!r}, whose module is not in this job's "
                              f"custom code ({custom_dir}); {rule}")
    return method_in(load_module(str(shipped)), name, reference)  # that file, whatever else is on sys.path


class FlareSite:
    """One client's runner plus its resume-safe local state (transport-free: tests call it directly)."""

    def __init__(self, name: str, site_cfg: SiteConfig, workspace: Path, custom_dir: Optional[Path] = None):
        self.name = name
        self.site_cfg = site_cfg
        #: this app's ``custom/`` folder (where the client script lies): the job's own code
        self.custom_dir = custom_dir
        self.state_root = site_cfg.state_dir or (workspace / "fedcxr_state")
        self.runners: dict[str, Any] = {}  # experiment → SiteRunner (a job may run several experiments)
        self._restored: set[str] = set()
        self._he_context = None  # this site's secret CKKS context, loaded on the first sealed model

    # ------------------------------------------------------------------ sealed models (privacy.secure_aggregation)
    def he_context(self):
        """This site's secret context, from its FLARE startup kit (:func:`fedcxr.flare.he_keys.site_context`)."""
        if self._he_context is None:
            from fedcxr.flare.he_keys import site_context

            self._he_context = site_context()
        return self._he_context

    def open_params(self, params: Optional[dict]) -> tuple[Optional[dict], float]:
        """The received params with any sealed block opened; ``(params, seconds spent)``."""
        from fedcxr.flare.sealing import is_sealed, open_sealed

        if not is_sealed(params):
            return params, 0.0
        start = time.perf_counter()
        return open_sealed(params, self.he_context()), time.perf_counter() - start

    def seal_reply(self, reply: Reply, task: str, config: "TaskConfig | Mapping") -> float:
        """Seal every model ``reply`` carries, in place (the task's local keys stay here); seconds spent.

        Extra tensors (auto-β's batch updates, SCAFFOLD's Δc_i) cannot travel sealed: refused."""
        from fedcxr.flare.sealing import LOCAL_BLOCK, MODEL_BLOCK, SealError, seal

        if reply.extra:
            raise SealError(f"task {task}: extra tensors {sorted(reply.extra)[:3]} cannot travel sealed")
        if reply.params is None:
            return 0.0
        start = time.perf_counter()
        block = LOCAL_BLOCK if task == "local_state" else MODEL_BLOCK
        # a method's task config arrives as a mapping (its runner parses it), the runner's own typed
        exclude = tuple(config.get("local_keys") or ()) if block == MODEL_BLOCK and isinstance(config, Mapping) else ()
        reply.params = seal(reply.params, self.he_context(), block=block, exclude=exclude)
        return time.perf_counter() - start

    # ------------------------------------------------------------------ runner
    def runner_for(self, settings: dict, run: str):
        """The SiteRunner of one experiment (built on its first task: decoded-image cache, model)."""
        key = run + json.dumps(settings, sort_keys=True)
        if key not in self.runners:
            from fedcxr.pipeline.protocols.methods import site_tasks_for

            cfg = self.site_cfg
            method = site_method(settings.get("method"), self.custom_dir, cfg.allow_methods)
            model_cfg = dict(settings.get("model") or {})
            model_cfg["weights"] = None  # the server sends every weight; no local file is read
            workers = cfg.num_workers if cfg.num_workers is not None else settings.get("num_workers")
            device = resolve_device(cfg.device or settings.get("device"))
            engine = resolve_engine(device, settings.get("engine"), workers)
            apply_backend(engine)  # one site per client process: its cuDNN switches are its own
            self.runners[key] = SiteRunner(
                self.name, cfg.manifest_dir, model_cfg=model_cfg, image_size=int(settings["image_size"]),
                cache_dir=cfg.cache_dir or default_cache_dir(), device=device,
                augment=bool(settings.get("augment", True)), progress=False, engine=engine,
                task=settings.get("task"), tasks={**site_tasks_for(method), **CLIENT_TASKS},
            )
        return self.runners[key]

    # ------------------------------------------------------------------ local state (FedBN, PFL)
    def _state_dir(self, run: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run or "run")
        return self.state_root / safe

    def _saved_rounds(self, run: str) -> list[tuple[int, Path]]:
        found = []
        for path in self._state_dir(run).glob("round_*.pt"):
            try:
                found.append((int(path.stem.split("_")[1]), path))
            except (IndexError, ValueError):
                continue
        return sorted(found)

    def _restore(self, runner, task: str, config: TaskConfig, run: str) -> None:
        """After a (re)start: load the local state as it was at the end of the right round, once."""
        if run in self._restored:
            return
        r = getattr(config, "round", None)
        if isinstance(r, int):  # training round r starts from round r-1's state; evaluation after r sees r's
            upto = r - 1 if changes_state(runner, task) else r
        elif task == "local_state":  # the final collection: the newest state
            upto = None
        else:  # metadata and other round-less tasks need no state: decide on a later task
            return
        self._restored.add(run)
        usable = [(k, p) for k, p in self._saved_rounds(run) if upto is None or k <= upto]
        if usable:
            k, path = usable[-1]
            runner.set_local_state(load_tensors(path, "site state file"))
            log.info("site %s: restored local state saved after round %d", self.name, round_number(k))

    def _save(self, runner, config: TaskConfig, run: str) -> None:
        state = runner.get_local_state()
        r = getattr(config, "round", None)
        if not state or not isinstance(r, int):
            return
        atomic_torch_save(state, self._state_dir(run) / f"round_{r:04d}.pt")
        for _, old in self._saved_rounds(run)[:-KEEP_STATES]:
            old.unlink(missing_ok=True)

    # ------------------------------------------------------------------ one task
    def handle(self, task: str, params, config: TaskConfig | dict | None, runner_settings: dict, run: str):
        """Run one task; returns the :class:`Reply` (``local_state`` is answered here, not by SiteRunner).

        ``config``: the task's typed config (:func:`fedcxr.flare.wire.decode_task` parsed it), or a
        dict of its keys (parsed here)."""
        runner = self.runner_for(runner_settings, run)
        config = parse_task_config(task, config) if task == "local_state" else runner.parse(task, config)
        self._restore(runner, task, config, run)
        if task == "local_state":
            # the model's local entries only: optimiser moments and SCAFFOLD's c_i never leave the site
            state = {k: v for k, v in runner.get_local_state().items() if not k.startswith(PRIVATE_PREFIXES)}
            return Reply(site=self.name, params=state, class_set=runner.class_set)
        reply = runner.handle(task, params, config)
        if changes_state(runner, task):
            self._save(runner, config, run)
        return reply

    def streams(self, task: str, runner_settings: dict, run: str) -> Optional[str]:
        """What part of ``task``'s reply metrics this site streams (the task's ``streams``)."""
        entry = self.runner_for(runner_settings, run).tasks.get(task)
        return entry.streams if entry is not None else None


def changes_state(runner: SiteRunner, task: str) -> bool:
    """Whether ``task`` may change the site's local state (its :class:`SiteTask` says; ``local_state``: no)."""
    entry = runner.tasks.get(task)
    return bool(entry is not None and entry.changes_state)


# --------------------------------------------------------------------------- the Client API loop


def serve(flare_api: Any, site: FlareSite) -> int:
    """``receive → handle → send`` until the job ends; returns the number of tasks answered."""
    from fedcxr.flare import warm_up
    from fedcxr.flare.wire import decode_task, encode_error, encode_reply

    answered = 0
    writer = _site_writer()
    while flare_api.is_running():
        incoming = flare_api.receive()
        warm_up.finish()  # MONAI imported while this site waited (fedcxr.flare.warm_up)
        if incoming is None:
            break
        task_name = flare_api.get_task_name()
        try:
            task = decode_task(incoming.params, incoming.meta)
            name = task["task"] or task_name
            received, opened_s = site.open_params(task["params"])
            reply = site.handle(name, received, task["config"], task["runner"], task["run"])
            sealed_s = seal_if_asked(site, reply, name, task)
            if opened_s or sealed_s:
                reply.metrics = {**reply.metrics, "he_seconds": {"open": round(opened_s, 3), "seal": round(sealed_s, 3)}}
            diff = task["reply_weight_type"] == DELTAS and received is not None and reply.params is not None
            params, meta = encode_reply(reply, reference=received if diff else None)
            _stream(writer, site.streams(name, task["runner"], task["run"]), task["config"], reply.metrics)
        except Exception as exc:  # answer, and keep serving the next rounds
            log.exception("site %s: task %s failed", site.name, task_name)
            params, meta, diff = *encode_error(exc), False
        flare_api.send(reply_model(params, meta, diff=diff, steps=reply.n_batches if diff else 0))
        answered += 1
        warm_up.start()  # from here this thread only waits for the next task
    return answered


def seal_if_asked(site: FlareSite, reply: Reply, task: str, decoded: dict) -> float:
    """Seal the reply's models when the task asks (seconds spent); a site whose own configuration
    says ``secure_aggregation`` refuses to send a model in the clear whatever the task says."""
    if decoded["seal"]:
        return site.seal_reply(reply, task, decoded["config"])
    if site.site_cfg.secure_aggregation and reply.params is not None:
        from fedcxr.flare.sealing import SealError

        raise SealError(f"task {task} asks for a model in the clear, but this site's configuration "
                        f"({site.site_cfg.source}) says secure_aggregation: {site.site_cfg.secure_aggregation}")
    return 0.0


def reply_model(params: dict, meta: dict, *, diff: bool, steps: int):
    """The ``FLModel`` sent back: a reply of differences is marked ``DIFF`` (FLARE's ``WEIGHT_DIFF``)
    with its optimizer steps, which NVFLARE's ``PercentilePrivacy`` reads to work per step."""
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    if not diff:
        return FLModel(params=params, meta=meta)
    return FLModel(params=params, params_type=ParamsType.DIFF,
                   meta={**meta, "NUM_STEPS_CURRENT_ROUND": max(int(steps), 1)})


def _site_writer():
    """FLARE's experiment-tracking writer (the server's TensorBoard receiver gets the scalars), or None."""
    try:
        from nvflare.client.tracking import SummaryWriter

        return SummaryWriter()
    except Exception as exc:  # tracking never stops a site
        log.info("FLARE experiment tracking unavailable (%s); scalars stay in the server's run directory", exc)
        return None


def _stream(writer, prefix: Optional[str], config, metrics: dict) -> None:
    """This round's scalars of the site (:func:`fedcxr.tracking.site_scalars`: no ids, no paths)."""
    from fedcxr.tracking import site_scalars

    step = config.get("round") if isinstance(config, Mapping) else None
    if writer is None or not isinstance(step, int) or isinstance(step, bool):
        return
    try:
        for tag, value in site_scalars(prefix, metrics):
            writer.add_scalar(tag, value, global_step=step)
    except Exception as exc:
        log.warning("FLARE experiment tracking failed (%s: %s); training goes on", type(exc).__name__, exc)


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of the client script (FLARE runs it with the job's script arguments)."""
    import nvflare.client as flare

    parser = argparse.ArgumentParser(description="fedcxr FLARE client")
    parser.add_argument("--site-config", default=None, help="this site's JSON/YAML configuration")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    flare.init()
    name = flare.get_site_name()
    workspace = Path.cwd()  # FLARE starts client jobs in the site's workspace (its startup kit)
    script_dir = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else None
    path = find_site_config(args.site_config, script_dir, workspace)
    site_cfg = load_site_config(path, name)
    log.info("site %s: data from %s (config %s)", name, site_cfg.manifest_dir, path)
    served = serve(flare, FlareSite(name, site_cfg, workspace, custom_dir=script_dir))
    log.info("site %s: answered %d tasks", name, served)
    return 0
