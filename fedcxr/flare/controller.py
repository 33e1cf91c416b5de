"""The same round protocols on NVIDIA FLARE: the server's controller and transport (DESIGN §8).

On the FLARE server, :class:`FedcxrController` (a ``ModelController``) runs
:func:`fedcxr.pipeline.run_driver.run_experiment` — the very function ``fedcxr train`` runs —
with a :class:`FlareTransport` instead of the in-process one. Every protocol in
:mod:`fedcxr.pipeline.protocols` therefore runs unchanged: "send this model to these sites
for this task" becomes ``send_model_and_wait(task_name=..., targets=[...], data=FLModel(...))``
(or one FLARE task per site when sites get different payloads), and the replies come back as
:class:`~fedcxr.pipeline.messages.Reply`. Each hospital runs :mod:`fedcxr.flare.client`.

Failure handling (:mod:`fedcxr.flare.liveness`): a task is sent only to the sites whose FLARE
client is still connected (a client FLARE deemed disconnected is not asked, so later rounds do
not wait for it), and waits for them at most ``participation.deadline_s`` seconds for a round's
training tasks when the config sets it, else ``task_timeout`` (``--timeout``; 0: no limit; FLARE
still ends the wait for clients it deems disconnected) — :meth:`FlareTransport.task_wait` — a
site's tasks up to its first round of the job ``STARTUP_ALLOWANCE_S`` longer (its job process is
starting). Sites that were not asked, did not answer, answered with an error, or sent a payload
:mod:`fedcxr.flare.wire` refuses (NaN/Inf, unknown fields) are absent from the replies, with the
reason logged and kept (:attr:`FlareTransport.absent`: late, dropped out, error, refused); the
protocol records them in ``run.json["missed"]`` and fails the round below
``participation.min_sites``. A round asks only the sources ``participation.fraction`` draws (the
protocols: the same draw as in-process); the others are not asked, and not missed. An aborted
job (an admin's ``abort_job``, or FLARE's own when too few clients are left) ends the run where
it is: the round in progress is not completed with the replies that happened to arrive.

Persistence: the run directory (config, ``metrics.jsonl``, per-round checkpoints,
``final_model.pt``) is written by the server exactly as in-process runs write it. A server
killed mid-run is resumed by submitting the same job again: the controller continues from the
last checkpoint in its run directory (``resume=True``, the default); sites restore their own
local state (:class:`~fedcxr.flare.client.FlareSite`).

The job that places this controller on the server is built by :mod:`fedcxr.flare.job`;
``fedcxr flare export|simulate|poc`` is :mod:`fedcxr.commands.flare`.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from fedcxr.atomic import atomic_write_json
from fedcxr.errors import UserError
from fedcxr.pipeline.checkpoints import load_final_model, save_final
from fedcxr.pipeline.config import ExperimentConfig, config_fingerprint
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.flare.liveness import DISCONNECTED, SiteLiveness
from fedcxr.flare.secure_aggregation import HE
from fedcxr.flare.wire import WireError, decode_reply, encode_task
from fedcxr.flare import warm_up
from fedcxr.pipeline.messages import DELTAS, WEIGHTS, NoConfig, Reply
from fedcxr.pipeline.run_log import round_number
from fedcxr.pipeline.transport import Transport
from fedcxr.rundir import FLARE_STATUS, RunDir, finished_run

try:  # the server class needs FLARE; the rest of fedcxr does not
    from nvflare.app_common.workflows.model_controller import ModelController as _ControllerBase

    HAVE_NVFLARE = True
except ImportError:  # pragma: no cover - exercised only without the extra
    _ControllerBase = object
    HAVE_NVFLARE = False

log = logging.getLogger(__name__)

INSTALL_HINT = "NVIDIA FLARE is not installed: pip install 'fedcxr[flare]' (or: pip install nvflare)"
STATUS_FILE = FLARE_STATUS  # fedcxr.rundir
CLIENT_NAME = r"^[A-Za-z0-9_-]+$"  # FLARE's rule for client names


def require_nvflare() -> None:
    if not HAVE_NVFLARE:
        raise UserError(INSTALL_HINT)


# --------------------------------------------------------------------------- transport


class FlareTransport(Transport):
    """:class:`Transport` over a running FLARE job (built by :class:`FedcxrController`)."""

    def __init__(self, controller: "FedcxrController", site_names: list[str], *, runner: dict, run: str,
                 reply_weight_type: str = WEIGHTS, sealed=None, deadline_s: Optional[float] = None):
        self.controller = controller
        self.deadline_s = deadline_s  # participation.deadline_s: the wait of a round's training tasks
        self.absent: dict[str, dict] = {}  # why each absent target of the latest run did not answer
        # privacy.secure_aggregation: the server's SealedAggregation; every task asks for sealed replies
        self.sealed = sealed
        self.site_names = list(site_names)
        self.runner = dict(runner)
        self.run_key = run
        self.reply_weight_type = reply_weight_type  # privacy.filters: DELTAS, differences (fedcxr.flare.wire)
        self.rejected: list[dict] = []  # {"round", "task", "site", "reason"} of refused replies (status file)

    def run(self, task, targets, params, config, *, per_site=None):
        per_site = dict(per_site or {})
        unknown = [s for s in targets if s not in self.site_names]
        if unknown:
            raise ValueError(f"task {task!r} for sites {unknown} that are not clients of this job")
        shared = [s for s in targets if s not in per_site]
        groups, sent = [], {}
        seal = HE if self.sealed is not None else None
        if shared:
            groups.append((shared, encode_task(task, params, config, runner=self.runner, run=self.run_key,
                                               reply_weight_type=self.reply_weight_type, seal=seal)))
            sent.update({s: params for s in shared})
        for site in targets:
            if site in per_site:
                site_params, site_config = per_site[site]
                groups.append(([site], encode_task(task, site_params, site_config, runner=self.runner,
                                                   run=self.run_key,
                                                   reply_weight_type=self.reply_weight_type, seal=seal)))
                sent[site] = site_params
        round_ = getattr(config, "round", None)
        if round_ is None and per_site:
            round_ = getattr(next(iter(per_site.values()))[1], "round", None)
        timeout = self.task_wait(round_)
        warm_up.start()  # MONAI imported while the server waits for its first task's replies
        try:
            raw = self.controller.dispatch(task, groups, round_=round_, timeout=timeout)
        finally:
            warm_up.finish()
        # the wait FLARE was given: the start-up allowance added for a site's first round (liveness)
        return self._decode(task, targets, raw, round_, sent, getattr(self.controller, "last_wait", timeout))

    def task_wait(self, round_: Optional[int]) -> int:
        """Seconds a task waits for its sites (FLARE's ``timeout``; 0: no limit): ``participation.deadline_s``
        (rounded up to whole seconds) for a round's training tasks when the config sets it, else ``--timeout``
        (``task_timeout``), which also bounds every task outside the rounds (metadata, validation, cross-site)."""
        if round_ is not None and self.deadline_s:
            return max(1, math.ceil(float(self.deadline_s)))
        return int(self.controller.task_timeout)

    def _decode(self, task: str, targets: list[str], raw: Mapping[str, Any], round_,
                sent: Mapping[str, Any], timeout: int = 0) -> dict[str, Reply]:
        replies = {}
        self.absent = {}
        for site in targets:
            if site not in raw:
                liveness = getattr(self.controller, "liveness", None)
                if liveness is not None and liveness.reason(site) == DISCONNECTED:
                    self.absent[site] = {"why": "dropped", "reason": DISCONNECTED}  # FLARE lost its client
                else:
                    self.absent[site] = no_reply(timeout, deadline=round_ is not None and bool(self.deadline_s))
                continue
            answer = raw[site]
            try:
                if isinstance(answer, str):
                    self.absent[site] = {"why": "error", "reason": f"error: {answer}"[:300]}
                    raise WireError(answer)
                replies[site] = decode_reply(site, answer.params, answer.meta, reference=sent.get(site),
                                             task=task, sealed=self.sealed is not None)
                excluded = replies[site].metrics.get("excluded")
                if excluded:
                    log.info("%s, task %s: %s's filters removed %d entries (kept at the sent value)",
                             _round_text(round_), task, site, len(excluded))
            except WireError as exc:
                log.warning("%s, task %s: rejected reply from %s: %s", _round_text(round_), task, site, exc)
                self.rejected.append({"round": round_, "task": task, "site": site, "reason": str(exc)})
                self.controller.liveness.note(site, f"reply refused: {exc}")
                self.absent.setdefault(site, {"why": "refused", "reason": f"refused by the wire checks: {exc}"[:300]})
        return replies

    def absence_reason(self, site: str) -> Optional[str]:
        """Why ``site`` sent no usable reply to the last task it was part of: :attr:`absent`'s reason, else
        what :mod:`fedcxr.flare.liveness` recorded (a task dispatched outside :meth:`run`)."""
        entry = self.absent.get(site)
        return entry["reason"] if entry else self.controller.liveness.reason(site)


def _round_text(round_) -> str:
    """``round 3`` as people count (``config.round`` is the 0-based index), ``no round`` for round-less tasks."""
    return f"round {round_number(round_)}" if isinstance(round_, int) else "no round"


def no_reply(timeout: int, *, deadline: bool) -> dict:
    """Why a site that sent nothing is absent: late when the task had a bound, else no reply
    (FLARE ended the wait: the client is gone)."""
    if timeout:
        what = "participation.deadline_s" if deadline else "--timeout"
        return {"why": "late", "reason": f"no reply within {timeout} s ({what})"}
    return {"why": "no reply", "reason": "no reply (FLARE ended the wait: the client is gone)"}


# --------------------------------------------------------------------------- server controller


class FedcxrController(_ControllerBase):
    """FLARE server workflow: fedcxr experiments, one after the other, each checkpointed in its run dir.

    Args (all JSON-able, FLARE writes them into ``config_fed_server.json``):
        experiments: ``[{"config": ExperimentConfig.model_dump(mode="json"), "run_dir": str,
            "resume": bool, "evaluation": {"enabled", "n_boot", "split", "seed"}}]``; ``evaluation``
            is the cross-site evaluation after the last round (:mod:`fedcxr.flare.cross_site`).
            ``run_dir`` is the server-side run directory (default
            ``<job workspace>/fedcxr_run[_N]``; give a stable path to be able to resume after a
            server crash); ``resume`` (default true) continues from its last checkpoint. Several
            experiments (a sweep) share one deployment; a failed one does not stop the next.
        task_timeout: seconds a task waits for its sites (0: no limit).
        task_check_period: seconds between the controller's checks of running tasks.
        fedcxr_version: the fedcxr version that wrote the job; a server with another
            major.minor version refuses the job (its task formats may differ) and says so.

    FLARE client names are the config's site names.
    """

    def __init__(self, experiments: Optional[list] = None, task_timeout: int = 0, task_check_period: float = 0.1,
                 fedcxr_version: str = ""):
        require_nvflare()
        # the job's FedcxrModelPersistor (fedcxr.flare.persistor) receives each final global model
        super().__init__(persistor_id="persistor", ignore_result_error=True, task_check_period=task_check_period)
        self.experiments = [dict(e) for e in experiments or []]
        self.task_timeout = int(task_timeout)
        self.fedcxr_version = str(fedcxr_version or "")
        # which sites FLARE still reaches, how long a task waits, why a site is absent
        self.liveness = SiteLiveness(self.get_client_disconnect_time, self.task_timeout)
        self.last_wait = self.task_timeout  # seconds the latest dispatched task waited (0: no limit)

    # ------------------------------------------------------------------ the workflow
    def run(self) -> None:
        problem = version_problem(self.fedcxr_version)
        if problem:
            raise RuntimeError(problem)
        failed = []
        for i, spec in enumerate(self.experiments):
            if self._aborted():  # the job ends here; a resubmitted job continues every experiment
                failed.append("the rest: the FLARE job was aborted")
                break
            default = "fedcxr_run" if len(self.experiments) == 1 else f"fedcxr_run_{i}"
            run_dir = Path(spec.get("run_dir") or Path(self.get_run_dir()) / default)
            if not self.run_one(spec["config"], run_dir, resume=bool(spec.get("resume", True)),
                                evaluation=spec.get("evaluation")):
                failed.append(str(run_dir))
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(self.experiments)} experiments failed: {failed}")

    def run_one(self, config: dict, run_dir: Path, *, resume: bool, evaluation: Optional[dict] = None) -> bool:
        """One experiment, exactly as ``fedcxr train`` runs it, over FLARE; False when it failed."""
        cfg = ExperimentConfig.model_validate(config)
        sites = [cfg.site_name(s) for s in cfg.all_sites()]
        try:
            sealed = self._sealed_aggregation(cfg)
        except Exception as exc:  # no HE context in the server's kit, no TenSEAL: the run cannot start
            self.exception(f"fedcxr {cfg.method}: privacy.secure_aggregation: {type(exc).__name__}: {exc}")
            write_status(run_dir, "failed", error=f"{type(exc).__name__}: {exc}")
            return False
        transport = FlareTransport(self, sites, runner=runner_settings(cfg), run=config_fingerprint(cfg),
                                   reply_weight_type=DELTAS if cfg.privacy.filters else WEIGHTS, sealed=sealed,
                                   deadline_s=cfg.participation.deadline_s)
        previous = read_status(run_dir) if resume else {}
        if resume:  # replies refused before a server restart stay on record
            transport.rejected = list(previous.get("rejected", []))
        done_before = finished_run(run_dir) if resume else None
        self.info(f"fedcxr {cfg.method}: {cfg.rounds} rounds over {sites}; run directory {run_dir}")
        write_status(run_dir, "running", started=time.time(), rejected=transport.rejected)
        try:
            payload = run_experiment(cfg, run_dir, resume=resume, device="cpu", progress=False, transport=transport)
            self._collect_local_states(run_dir, transport, sites)
            self._persist(run_dir, cfg)
        except JobAborted as exc:
            self.warning(f"fedcxr {cfg.method} stopped: {exc}")
            RunDir(run_dir).mark_stopped()
            write_status(run_dir, "stopped", error=str(exc), rejected=transport.rejected)
            return False
        except Exception as exc:
            self.exception(f"fedcxr {cfg.method} failed: {type(exc).__name__}: {exc}")
            write_status(run_dir, "failed", error=f"{type(exc).__name__}: {exc}", rejected=transport.rejected)
            return False
        from fedcxr.flare.cross_site import evaluation_settings

        settings = evaluation_settings(evaluation)
        evaluated = kept_evaluation(previous, settings, run_dir) if done_before is not None else None
        if evaluated is not None:
            self.info(f"fedcxr {cfg.method}: cross-site evaluation of this finished run kept ({evaluated})")
        else:
            evaluated = self._cross_site(run_dir, transport, settings)
        write_status(run_dir, "finished", missed=payload.get("missed", []), rejected=transport.rejected,
                      cross_site=evaluated, evaluation=settings)
        self.info(f"fedcxr {cfg.method}: finished; {len(payload.get('missed', []))} replies missed or rejected")
        return True

    def _sealed_aggregation(self, cfg: ExperimentConfig):
        """The server's secure aggregation for ``privacy.secure_aggregation`` (its kit's public HE context), or None."""
        if not cfg.privacy.secure_aggregation:
            return None
        from fedcxr.flare.he_keys import TENSEAL_HINT, have_tenseal, server_context
        from fedcxr.flare.secure_aggregation import SealedAggregation

        if not have_tenseal():
            raise RuntimeError(TENSEAL_HINT)
        sealed = SealedAggregation(server_context(self.fl_ctx))
        self.info(f"fedcxr {cfg.method}: secure aggregation ({cfg.privacy.secure_aggregation}): the sites send CKKS-"
                  "encrypted models, this server sums them without reading one")
        return sealed

    def _collect_local_states(self, run_dir: Path, transport: FlareTransport, sites: list[str]) -> None:
        """FedBN/PFL: evaluation needs each site's local entries; ask the sites for them once, at the end."""
        final = load_final_model(run_dir)
        if not final.get("eval_local_keys") or final.get("local_states"):  # none, or collected (a resumed finished run)
            return
        replies = transport.run("local_state", sites, None, NoConfig())
        final["local_states"] = {s: rep.params or {} for s, rep in replies.items()}
        if transport.sealed is not None:  # each site's own entries, sealed: kept so, opened with the final model
            from fedcxr.flare.secure_aggregation import local_block_of

            for site, state in list(final["local_states"].items()):
                try:
                    ok = not state or local_block_of(state)
                except ValueError:
                    ok = False
                if not ok:
                    self.warning(f"site {site}'s sealed local state is not one block of its local entries: not kept")
                    final["local_states"].pop(site)
        save_final(run_dir, final)

    def _persist(self, run_dir: Path, cfg: ExperimentConfig) -> None:
        """The final global model through FLARE's persistor (FLARE's tools find it there)."""
        if getattr(self, "persistor", None) is None:
            return
        from nvflare.app_common.abstract.fl_model import FLModel

        from fedcxr.flare.persistor import to_numpy

        final = load_final_model(run_dir)
        self.save_model(FLModel(params=to_numpy(final["global"]), meta={"method": cfg.method_name}))

    def _cross_site(self, run_dir: Path, transport: FlareTransport, settings: dict) -> str:
        """Cross-site evaluation (:mod:`fedcxr.flare.cross_site`); its failure does not undo the training."""
        from fedcxr.flare.cross_site import cross_site_evaluate

        if not settings["enabled"]:
            return "off"
        try:
            report = cross_site_evaluate(transport, run_dir, settings)
        except Exception as exc:
            self.exception(f"cross-site evaluation failed: {type(exc).__name__}: {exc}")
            return f"failed: {type(exc).__name__}: {exc}"
        return cross_site_summary(len(report["sites"]), len(report["sites_without_predictions"]))

    # ------------------------------------------------------------------ one task, many sites
    def dispatch(self, task: str, groups: list[tuple[list[str], tuple[dict, dict]]],
                 round_: Optional[int] = None, timeout: Optional[int] = None) -> dict[str, Any]:
        """Send each group's payload to its sites; ``{site: FLModel | error text}`` of those that answered.

        Sites FLARE deemed disconnected are not asked (:meth:`reachable_groups`); the others are waited
        for :meth:`SiteLiveness.timeout` seconds from ``timeout`` (default ``task_timeout``, ``--timeout``;
        0: no limit), kept as :attr:`last_wait`. One group (the same model for every site) is FLARE's
        ``send_model_and_wait``. Several groups (per-site payloads, e.g. surgical heads) run as
        concurrent FLARE tasks so sites still train in parallel. :class:`JobAborted` when the job was
        aborted meanwhile (the replies that happened to arrive are not used).
        """
        from nvflare.app_common.abstract.fl_model import FLModel

        groups = self.reachable_groups(task, groups, round_)
        if not groups:
            return {}
        targets = [s for members, _ in groups for s in members]
        timeout = self.liveness.timeout(targets, round_, base=timeout)
        self.last_wait = timeout
        models = [(members, FLModel(params=params, meta=meta, current_round=round_)) for members, (params, meta)
                  in groups]
        if len(models) == 1:
            members, model = models[0]
            results = self.send_model_and_wait(task_name=task, data=model, targets=list(members), timeout=timeout)
            answers = {m.meta.get("client_name"): m for m in results}
        else:
            answers = self._dispatch_concurrently(task, models, timeout)
        self._stop_if_aborted()
        self.liveness.note_unanswered([s for s in targets if s not in answers], timeout)
        return answers

    def reachable_groups(self, task: str, groups: list, round_: Optional[int] = None) -> list:
        """``groups`` without the sites FLARE deemed disconnected (their absence reason recorded);
        a group left without sites is dropped."""
        live, gone = self.liveness.split([s for members, _ in groups for s in members],
                                         what=f"{_round_text(round_)} (task {task})")
        if not gone:
            return groups
        keep = set(live)
        return [([s for s in members if s in keep], payload) for members, payload in groups
                if any(s in keep for s in members)]

    def _aborted(self) -> bool:
        return self.abort_signal is not None and self.abort_signal.triggered

    def _stop_if_aborted(self) -> None:
        if self._aborted():
            gone = sorted(site for site, why in self.liveness.reasons.items() if why == "disconnected")
            raise JobAborted("the FLARE job was aborted (by an admin's abort_job, or by FLARE when fewer clients "
                             "than the job's min_clients were left" + (f"; deemed disconnected: {', '.join(gone)}"
                                                                      if gone else "") + ")")

    def _dispatch_concurrently(self, task_name: str, models: list, timeout: int) -> dict[str, Any]:
        from nvflare.apis.controller_spec import Task
        from nvflare.apis.fl_constant import ReturnCode
        from nvflare.app_common.utils.fl_model_utils import FLModelUtils

        answers: dict[str, Any] = {}

        def on_result(client_task, fl_ctx):
            name, result = client_task.client.name, client_task.result
            rc = result.get_return_code() if result is not None else None
            if rc not in (None, ReturnCode.OK):
                answers[name] = f"FLARE return code {rc}"
            else:
                try:
                    answers[name] = FLModelUtils.from_shareable(result)
                except Exception as exc:  # a malformed result is a refused reply, not a crash
                    answers[name] = f"unreadable result ({type(exc).__name__})"
            client_task.result = None

        tasks = []
        for targets, model in models:
            flare_task = Task(name=task_name, data=FLModelUtils.to_shareable(model), timeout=timeout,
                              result_received_cb=on_result)
            self.broadcast(task=flare_task, fl_ctx=self.fl_ctx, targets=list(targets), min_responses=len(targets))
            tasks.append(flare_task)
        while any(t.completion_status is None for t in tasks):
            if self._aborted():
                for t in tasks:
                    self.cancel_task(t)
                break
            time.sleep(self._task_check_period)
        return answers


class JobAborted(RuntimeError):
    """The FLARE job was aborted while a task ran: the run stops where it is (its last complete round
    is checkpointed; a resubmitted job continues from there)."""


def version_problem(job_version: str) -> Optional[str]:
    """Why this server's fedcxr cannot run a job written by ``job_version`` (None when it can)."""
    import fedcxr

    def major_minor(text: str) -> tuple[str, ...]:
        return tuple(text.split(".")[:2])

    if job_version and major_minor(job_version) != major_minor(fedcxr.__version__):
        return (f"this FLARE job was written by fedcxr {job_version} but the server runs fedcxr "
                f"{fedcxr.__version__}; re-export it with `fedcxr flare export` of the installed version")
    return None


def runner_settings(cfg) -> dict:
    """What a site needs from the experiment to build its network and data (no paths, no data)."""
    return {"model": cfg.model.model_dump(mode="json"), "image_size": cfg.image_size, "augment": cfg.augment,
            "num_workers": cfg.num_workers, "device": cfg.device, "engine": cfg.engine.model_dump(mode="json"),
            "task": cfg.task.model_dump(mode="json") if cfg.task else None,
            "method": cfg.method}  # a site loads a method of the user's own only as it allows (fedcxr.flare.client)


def write_status(run_dir: Path, status: str, **extra) -> None:
    """``flare_status.json``: ``status`` (submitted/running/finished/failed/stopped) and what goes with it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / STATUS_FILE, {"status": status, "time": time.time(), **extra})


def read_status(run_dir: Path) -> dict:
    """``flare_status.json``: status (submitted/running/finished/failed/stopped), error, rejected replies."""
    path = Path(run_dir) / STATUS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def kept_evaluation(previous: Mapping, settings: dict, run_dir: Path) -> Optional[str]:
    """The cross-site result of a run finished before this job (``previous``: its status when the job
    was submitted, see :func:`mark_submitted`) when it stands: evaluated with the same ``settings``
    by every site (none failed or missing: one that was down may answer now), its report on disk.
    The same final model and settings give the same report (the bootstrap is seeded), so it is
    kept rather than asked of every site again; None: evaluate."""
    kept = previous.get("evaluated_before") or {}
    result = kept.get("cross_site")
    if kept.get("settings") != settings or not isinstance(result, str):
        return None
    if result == "off":
        return result
    return result if every_site_reported(result) and RunDir(run_dir).report_json.is_file() else None


def cross_site_summary(reported: int, not_reported: int) -> str:
    """The cross-site result recorded in the run's FLARE status (read back by :func:`every_site_reported`)."""
    return f"{reported} sites reported, {not_reported} not"


def every_site_reported(summary: str) -> bool:
    """Whether a :func:`cross_site_summary` says that no site was left out."""
    return re.fullmatch(r"\d+ sites reported, 0 not", summary) is not None


def mark_submitted(run_dir: Path, *, keep: bool) -> None:
    """Before a job starts: no stale "finished"; a resumed run keeps the replies rejected so far, and
    a finished one the record of its cross-site evaluation (``evaluated_before``: the controller
    does not evaluate a finished run again with the same settings — resuming a finished run
    changes no file, as in ``fedcxr train --resume``)."""
    previous = read_status(run_dir) if keep else {}
    if previous or not keep:
        extra = {}
        if previous.get("status") == "finished" and "evaluation" in previous:
            extra["evaluated_before"] = {"settings": previous["evaluation"], "cross_site": previous.get("cross_site")}
        write_status(Path(run_dir), "submitted", rejected=previous.get("rejected", []), **extra)
