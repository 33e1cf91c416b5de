"""Leaf: one way to map a function over chunks of work, in worker processes when asked, with one bar.

Ingest's image checks, the DICOM adapters' header reads and training's decode-once cache all
run a picklable function over chunks of file paths. They share this helper so that they share
its rules:

* **serial** with ``workers <= 1`` or a single chunk (a process pool costs more than it saves
  on a few files), otherwise a ``ProcessPoolExecutor`` of ``min(workers, chunks)`` processes;
* **results in input order**, and **memory bounded**: at most ``in_flight`` chunks are submitted
  and not yet consumed (default ``2 × workers``), never the whole job as ``Executor.map`` does
  (a 200,000-image cache needs a few chunks of decoded pixels, not the site's);
* **one progress policy** (:func:`fedcxr.logs.bar_disabled`): a bar counting items, shown only
  when progress is wanted and stderr is a terminal, never in a log file or CI.

tqdm's own ``tqdm.contrib.concurrent.process_map`` was the first choice; it submits every item
at once, keeps every result until the end and always starts a pool, so it fits none of the three.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar

from fedcxr.logs import bar_disabled

R = TypeVar("R")


def map_chunks(fn: Callable[..., R], chunks: Sequence[Sequence[Any]], *args: Any, workers: int = 1,
               progress: bool = True, desc: str, unit: str = "img", leave: bool = True,
               in_flight: Optional[int] = None) -> Iterator[R]:
    """``fn(chunk, *args)`` for every chunk, yielded in order; the bar advances by ``len(chunk)``.

    ``fn`` must be a module-level function (process pools pickle it). A generator: the pool
    and the bar close when it is exhausted or closed.
    """
    from tqdm import tqdm

    bar = tqdm(total=sum(len(c) for c in chunks), desc=desc, unit=unit, leave=leave,
               disable=bar_disabled(progress))
    try:
        if workers > 1 and len(chunks) > 1:
            with ProcessPoolExecutor(max_workers=min(workers, len(chunks))) as pool:
                jobs = ((len(chunk), chunk) for chunk in chunks)
                for size, result in bounded_map(pool, fn, jobs, *args, limit=in_flight or 2 * workers):
                    bar.update(size)
                    yield result
        else:
            for chunk in chunks:
                result = fn(chunk, *args)
                bar.update(len(chunk))
                yield result
    finally:
        bar.close()


def bounded_map(pool: Executor, fn: Callable[..., R], jobs: Iterable[tuple[Any, Any]], *args: Any,
                limit: int) -> Iterator[tuple[Any, R]]:
    """``(key, fn(job, *args))`` for ``(key, job)`` in ``jobs``, in order, with at most ``limit``
    jobs submitted and not yet consumed.

    ``Executor.map`` submits every chunk at once and keeps every finished one until the
    consumer reaches it; here at most ``limit`` results exist at a time.
    """
    pending: deque = deque()
    for key, job in jobs:
        if len(pending) >= limit:
            done_key, future = pending.popleft()
            yield done_key, future.result()
        pending.append((key, pool.submit(fn, job, *args)))
    while pending:
        done_key, future = pending.popleft()
        yield done_key, future.result()


__all__ = ["bounded_map", "map_chunks"]
