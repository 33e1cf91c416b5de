"""A loader with persistent workers is freed as soon as its last reference goes, workers and all.

It used to sit in a reference cycle (loader → worker iterator → sampler → loader): only the
garbage collector freed it, in an order that left each worker to its 5 s join timeout — 10 s per
loader, at whatever moment the collector ran (in the test suite: 30 s inside an unrelated test).
"""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from fedcxr.pipeline.data import load_site, make_dataset, make_loader

from .test_data import write_toy_site


def test_a_persistent_worker_loader_is_freed_without_the_garbage_collector(tmp_path):
    site = load_site(write_toy_site(tmp_path, n=8))
    ds = make_dataset(site, "train", classes=["edema"], aux_tasks=[], image_size=8, cache_dir=tmp_path / "cache",
                      augment=False, progress=False)
    loader = make_loader(ds, batch_size=2, shuffle=True, seed=0, augment=False, num_workers=1,
                         persistent_workers=True)
    for _ in range(2):
        assert sum(len(batch["index"]) for batch in loader) == len(ds)
    workers = list(loader._iterator._workers)
    assert workers and all(w.is_alive() for w in workers)
    gone = weakref.ref(loader)
    gc.disable()
    try:
        started = time.perf_counter()
        del loader  # reference counting alone frees it: no cycle left for the collector
        assert gone() is None
        assert time.perf_counter() - started < 4.0, "workers waited for their join timeout"
    finally:
        gc.enable()
    for w in workers:
        w.join(timeout=5)
    assert not any(w.is_alive() for w in workers)


@pytest.fixture(autouse=True)
def _collected():
    yield
    gc.collect()
