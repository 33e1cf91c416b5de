"""Parallel site processes: the in-process simulator's sites trained at the same time (``engine.site_workers``).

The thread policy's other half (:mod:`fedcxr.pipeline.engine`, "Parallel sites"): a training
process of one torch thread uses one core, so on a CPU the round's sites can train in several
processes of one thread each instead of one after another. Off by default (0): on the shared
2-core machine the workers' start-up cost more than a demo-sized run's rounds gained
(BENCHMARKS.md "Parallel site processes", ``benchmarks/bench_site_workers.py``).

:class:`SiteWorkers` is a :class:`~fedcxr.pipeline.transport.Transport` like
:class:`~fedcxr.pipeline.inprocess.InProcessTransport`, with the sites spread over worker processes:

* **only what a site needs**: a worker is sent its own sites' names and folders and the runner
  settings every site shares (model, image size, cache folder, engine, augmentation, the shared
  task) — not the experiment config. It builds those :class:`~fedcxr.pipeline.site_runner.SiteRunner`\\ s
  and keeps them, with their local state (BN statistics, kept heads, optimiser moments, a GP
  target's held model), for the whole run. Sites are spread by training rows (:func:`spread`).
* **the same computation**: a worker answers a task with the runner code the main process would
  run, with the run's engine (``threads`` torch threads); every random draw of a task derives
  from (seed, round, site, task), never from what the process did before, and the replies are
  returned in the order of the request. So a run ends with the same weights, bit for bit, for
  any number of workers, and a checkpoint written with one setting resumes with another
  (``tests/pipeline/test_site_workers.py``).
* **started from a fork server** that imports torch, MONAI's networks and fedcxr once (plain
  ``fork`` is not safe: a child of a process whose torch has run OpenMP threads can hang).
* **stopped, and failing, loudly**: :meth:`SiteWorkers.close` (the run driver calls it however a
  run ends) asks each worker to stop and kills one that does not within :data:`STOP_TIMEOUT`
  seconds. Workers ignore the terminal's Ctrl-C (the main process handles it), are daemonic, and
  die with the fork server, which exits with the main process (Linux ``PR_SET_PDEATHSIG``). An
  exception in a site's task is raised in the main process with its type (a bad input still
  exits 2) and a note naming the site; a worker that dies fails the run with
  :class:`~fedcxr.errors.RunFailed` naming its sites (exit 1, ``--resume`` continues from the
  last checkpoint). A worker's log records are replayed in the main process (``train.log``).

Nothing is written by a worker that the sequential run would not write (the image cache); the
messages are pickles on pipes between the main process and the workers it started.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import pickle
import signal
import sys
import traceback
import types
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from fedcxr.errors import RunFailed
from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.transport import Transport

log = logging.getLogger(__name__)

#: Modules the fork server imports once for every worker it starts (MONAI's networks and torch's
#: ``_dynamo``, which the first optimizer of a process imports, cost seconds each).
PRELOAD = ("fedcxr.pipeline.site_workers", "fedcxr.pipeline.site_runner", "fedcxr.pipeline.local",
           "fedcxr.pipeline.protocols", "fedcxr.models.network", "monai.networks.nets", "pyarrow.parquet",
           "torch._dynamo")
#: Seconds a worker gets to stop when asked, before it is killed.
STOP_TIMEOUT = 5.0


def spread(sizes: Mapping[str, int], workers: int) -> list[list[str]]:
    """The sites of ``sizes`` (name → training rows) in at most ``workers`` groups: largest first,
    each onto the group with the fewest rows so far (ties: the lower group). Each group keeps the
    order of ``sizes``; empty groups are dropped."""
    loads = [0] * max(1, int(workers))
    groups: list[list[str]] = [[] for _ in loads]
    for name in sorted(sizes, key=lambda n: -int(sizes[n])):  # sorted is stable: ties keep their order
        w = min(range(len(loads)), key=lambda i: (loads[i], i))
        groups[w].append(name)
        loads[w] += int(sizes[name])
    order = {name: i for i, name in enumerate(sizes)}
    return [sorted(group, key=order.__getitem__) for group in groups if group]


@dataclass(frozen=True)
class _WorkerSpec:
    """What a worker gets when it starts: its runners' names and folders, the settings they share."""

    runners: dict  # name -> site folder (or folders: a pooled site)
    common: dict  # the SiteRunner keyword arguments every site shares
    log_level: int
    method: str = ""  # the config's method: its tasks are looked up in the worker (a user's file is loaded there)


class SiteWorkers(Transport):
    """The in-process simulator with the sites in ``workers`` worker processes (module doc)."""

    def __init__(self, dirs: Mapping[str, Path | list[Path]], common: Mapping[str, Any], workers: int, *,
                 method: str = ""):
        """``dirs``: each runner's name and site folder(s); ``common``: the :class:`~fedcxr.pipeline.
        site_runner.SiteRunner` keyword arguments they share (:func:`fedcxr.pipeline.inprocess.runner_kwargs`);
        ``method``: the config's method, whose site tasks (and every built-in method's) each worker
        looks up itself — a method of the user's own is a file each worker loads, not a pickle."""
        from fedcxr.pipeline.data import load_site

        engine = common["engine"]
        # a worker is daemonic and so starts no processes of its own: its caches decode in it, one core each
        common = {**common, "progress": False, "engine": replace(engine, cache_workers=1)}
        self.site_names = list(dirs)
        rows = {name: sum(_train_rows(load_site(d)) for d in ([d] if isinstance(d, (str, Path)) else d))
                for name, d in dirs.items()}
        self.groups = spread(rows, workers)
        self.worker_of = {site: w for w, group in enumerate(self.groups) for site in group}
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._in_flight = False
        self._closed = False
        level = logging.getLogger("fedcxr").getEffectiveLevel()
        try:
            self._start([_WorkerSpec({s: dirs[s] for s in group}, common, level, method) for group in self.groups])
        except BaseException:
            self.close()
            raise
        log.info("training the sites in %d worker processes of %d torch thread(s) each: %s", len(self.groups),
                 engine.threads, "; ".join(", ".join(g) for g in self.groups))

    # ------------------------------------------------------------------ lifecycle
    def _start(self, specs: list[_WorkerSpec]) -> None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        with _without_main():
            for w, spec in enumerate(specs):
                ours, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=_worker_main, args=(theirs, spec), name=f"fedcxr-site-worker-{w}",
                                   daemon=True)
                proc.start()
                theirs.close()
                self._procs.append(proc)
                self._conns.append(ours)
        self._call({w: ("ready",) for w in range(len(specs))})

    def close(self) -> None:
        """Stop every worker: asked first (unless a task was interrupted), killed when it does not stop."""
        if self._closed:
            return
        self._closed = True
        graceful = not self._in_flight
        for conn in self._conns:
            if graceful:
                with contextlib.suppress(OSError, ValueError):
                    _send(conn, ("stop",))
        for proc in self._procs:
            proc.join(STOP_TIMEOUT if graceful else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (tests kill one, and check that none outlives :meth:`close`)."""
        return [int(p.pid) for p in self._procs if p.pid is not None]

    # ------------------------------------------------------------------ the transport
    def run(self, task, targets, params, config, *, per_site=None) -> dict[str, Reply]:
        per_site = per_site or {}
        unknown = [s for s in targets if s not in self.worker_of]
        if unknown:
            raise KeyError(f"no site runner named {unknown[0]!r} (sites: {self.site_names})")
        shared = pickle.dumps((task, params, config), protocol=pickle.HIGHEST_PROTOCOL)
        jobs: dict[int, list] = {}
        for site in targets:
            jobs.setdefault(self.worker_of[site], []).append((site, per_site.get(site)))
        answers: dict[str, tuple[bool, Any]] = {}
        for items in self._call({w: ("run", shared, items) for w, items in jobs.items()}).values():
            answers.update({site: (ok, value) for site, ok, value in items})
        replies = {}
        for site in targets:  # the request's order: the server aggregates in it
            ok, value = answers[site]  # sites after a failed one in its worker have no answer: raised before
            if not ok:
                raise value
            replies[site] = value
        return replies

    def local_states(self) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for states in self._call({w: ("states",) for w in range(len(self.groups))}).values():
            found.update(states)
        return {site: found[site] for site in self.site_names}

    def load_local_states(self, states: Mapping[str, dict]) -> None:
        parts: dict[int, dict] = {}
        for site, state in states.items():
            if site in self.worker_of:
                parts.setdefault(self.worker_of[site], {})[site] = state
        if parts:
            self._call({w: ("load", part) for w, part in parts.items()})

    # ------------------------------------------------------------------ plumbing
    def _call(self, messages: Mapping[int, tuple]) -> dict[int, Any]:
        """Send each worker its message and wait for every answer (or its death); replay the
        workers' logs; raise the first error."""
        if self._closed:
            raise RuntimeError("the site workers are stopped")
        self._in_flight = True
        for w, message in messages.items():
            try:
                _send(self._conns[w], message)
            except (OSError, ValueError):
                raise self._died(w) from None
        results: dict[int, Any] = {}
        errors: list[BaseException] = []
        pending = set(messages)
        while pending:
            conns = {self._conns[w]: w for w in pending}
            sentinels = {self._procs[w].sentinel: w for w in pending}
            for ready in wait(list(conns) + list(sentinels)):
                if ready in sentinels:  # a worker ended: fine only if its answer is already in the pipe
                    w = sentinels[ready]
                    if w in pending and not self._conns[w].poll():
                        raise self._died(w)
                    continue
                w = conns[ready]
                if w not in pending:
                    continue
                try:
                    status, value, records = _recv(ready)
                except (EOFError, OSError):
                    raise self._died(w) from None
                pending.discard(w)
                _replay(records)
                if status == "ok":
                    results[w] = value
                else:
                    errors.append(value)
        self._in_flight = False
        if errors:
            raise errors[0]
        return results

    def _died(self, w: int) -> RunFailed:
        proc = self._procs[w]
        proc.join(1)
        return RunFailed(f"the worker process training site(s) {', '.join(self.groups[w])} stopped unexpectedly "
                         f"(exit code {proc.exitcode}; out of memory? engine.site_workers: 0 trains the sites "
                         "one after another in this process)")


def _train_rows(site) -> int:
    return int((site.manifest["split"] == "train").sum())


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """Start processes without the caller's ``__main__``: multiprocessing would import the caller's
    script again in every worker (running it again where it has no ``if __name__ == "__main__"``
    guard), and a worker needs nothing from it."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


# --------------------------------------------------------------------------- the worker side


def _worker_main(conn: Connection, spec: _WorkerSpec) -> None:
    """A worker: build its sites' runners, then answer messages until asked to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _die_with_parent()
    buffer = _RecordBuffer()
    root = logging.getLogger()
    root.handlers[:] = [buffer]
    root.setLevel(spec.log_level)
    runners: dict = {}
    while True:
        try:
            message = _recv(conn)
        except (EOFError, OSError):
            return  # the main process is gone
        if message[0] == "stop":
            return
        try:
            if message[0] == "ready":
                runners = _build(spec)
                answer: tuple = ("ok", None, buffer.take())
            else:
                answer = ("ok", _answer(runners, message), buffer.take())
        except BaseException as exc:  # anything: the main process decides what it means
            answer = ("error", _portable(exc, ", ".join(spec.runners)), buffer.take())
        try:
            _send(conn, answer)
        except (OSError, ValueError):
            return


def _build(spec: _WorkerSpec) -> dict:
    """This worker's runners, with the run's engine (its threads set here, once: the process is ours),
    sharing one network per layout as the main process's do (:class:`~fedcxr.pipeline.model_pool.ModelPool`)."""
    from fedcxr.pipeline.engine import apply_backend
    from fedcxr.pipeline.model_pool import ModelPool
    from fedcxr.pipeline.site_runner import SiteRunner

    apply_backend(spec.common["engine"])
    common = dict(spec.common)
    if spec.method:
        from fedcxr.pipeline.protocols.methods import site_tasks

        common["tasks"] = {**site_tasks(spec.method), **(common.get("tasks") or {})}
    pool = ModelPool()
    return {name: SiteRunner(name, dirs, **common, pool=pool) for name, dirs in spec.runners.items()}


def _answer(runners: dict, message: tuple) -> Any:
    kind = message[0]
    if kind == "run":
        task, params, config = pickle.loads(message[1])
        out = []
        for site, own in message[2]:
            site_params, site_config = own if own is not None else (params, config)
            try:
                out.append((site, True, runners[site].handle(task, site_params, site_config)))
            except Exception as exc:  # this site's error; its worker's later sites wait, as in one process
                out.append((site, False, _portable(exc, site)))
                break
        return out
    if kind == "states":
        return {site: runner.get_local_state() for site, runner in runners.items()}
    if kind == "load":
        for site, state in message[1].items():
            runners[site].set_local_state(state)
        return None
    raise ValueError(f"site worker: unknown message {kind!r}")


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the fork server, which exits with the main
    process) exits, so no worker outlives a killed run. Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, TypeError):
        pass


class _RecordBuffer(logging.Handler):
    """Keeps a worker's log records, made picklable, until its next answer carries them back."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not format: keep the template
            message = str(record.msg)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args, record.exc_info = message, None, None
        self.records.append(record)

    def take(self) -> list[logging.LogRecord]:
        records, self.records = self.records, []
        return records


def _replay(records: list[logging.LogRecord]) -> None:
    """A worker's log records through this process's loggers (their handlers: ``train.log``, the console)."""
    for record in records:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


def _portable(exc: BaseException, sites: str) -> BaseException:
    """``exc`` as it can cross the pipe (itself when it pickles, else a RuntimeError naming it),
    with a note naming the site(s) and the worker's traceback."""
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        out = pickle.loads(pickle.dumps(exc))
    except Exception:
        out = RuntimeError(f"{type(exc).__name__}: {exc}")
    out.add_note(f"(raised for site {sites} in its site worker process)\n{trace}")
    return out


def _send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


__all__ = ["PRELOAD", "STOP_TIMEOUT", "SiteWorkers", "spread"]
