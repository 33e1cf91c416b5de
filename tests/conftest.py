"""Shared test fixtures.

``shared_data`` points at the real public data in ``../shared/data`` (beside the repository;
override with ``FEDCXR_SHARED``); tests that use it are skipped when it is absent. CI always
has it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]

#: The suite's time budget counts on Python's bytecode caches (``__pycache__``, git-ignored). Where the
#: environment forbids writing them (``PYTHONDONTWRITEBYTECODE``, set on some machines and images) and
#: a checkout has none, every pytest-xdist worker rewrote the asserts of all ~200 test modules again at
#: collection (~7 s of CPU a worker, half of what collecting costs) and every worker and every
#: ``fedcxr`` subprocess compiled fedcxr from source. Caches are only ever a copy of the source (Python
#: and pytest check them against the source's mtime and size), so the test processes write them here;
#: processes the tests start keep the environment's setting and read what is there.
sys.dont_write_bytecode = False


def pytest_configure(config):
    """Compile fedcxr's modules once, in the controlling process (the only one under ``-n 0``), so that
    the workers and the subprocesses the tests start (``fedcxr`` commands, import checks) read bytecode
    instead of each compiling the same sources. Up to date files are skipped (a stat each)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        import compileall

        compileall.compile_dir(str(REPO / "fedcxr"), quiet=2, workers=1)


def _shared_root() -> Path:
    env = os.environ.get("FEDCXR_SHARED")
    return Path(env) if env else REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` or skip."""
    path = _shared_root() / "data"
    if not path.is_dir():
        pytest.skip("../shared/data not present")
    return path


@pytest.fixture(scope="session")
def shared_papers() -> Path:
    path = _shared_root() / "papers"
    if not path.is_dir():
        pytest.skip("../shared/papers not present")
    return path


def write_csv_export(
    root: Path,
    rows: list[dict],
    mapping: dict,
    *,
    csv_name: str = "data.csv",
    image_column: str = "image",
    missing_images: tuple[str, ...] = (),
    size: int = 32,
) -> tuple[Path, Path]:
    """A small hospital export for the ``csv`` source: ``root/export/{data.csv, images}``.

    Every distinct ``row[image_column]`` except ``missing_images`` becomes a real grey PNG
    (``size`` px, distinct noise); ``mapping`` is written beside the export as YAML.
    Returns ``(input_dir, mapping_path)``.
    """
    import numpy as np
    import pandas as pd
    import yaml
    from PIL import Image

    export = root / "export"
    export.mkdir(parents=True, exist_ok=True)
    prefix = str(mapping.get("image", {}).get("prefix", "")) if isinstance(mapping.get("image"), dict) else ""
    suffix = str(mapping.get("image", {}).get("extension", "")) if isinstance(mapping.get("image"), dict) else ""
    rng = np.random.default_rng(0)
    for name in dict.fromkeys(str(r.get(image_column, "")) for r in rows):
        if not name or name in missing_images or ".." in name:
            continue
        path = export / prefix / f"{name}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8), "L").save(path)
    pd.DataFrame(rows).to_csv(export / csv_name, index=False)
    mapping_path = root / "mapping.yaml"
    mapping_path.write_text(yaml.safe_dump({"csv": csv_name, **mapping}, sort_keys=False))
    return export, mapping_path


@pytest.fixture
def csv_export(tmp_path):
    """Factory fixture around :func:`write_csv_export` rooted in ``tmp_path``."""

    def make(rows: list[dict], mapping: dict, **kwargs) -> tuple[Path, Path]:
        return write_csv_export(tmp_path, rows, mapping, **kwargs)

    return make


#: fixtures that start NVIDIA FLARE (a simulator job costs ~15-20 s to start, a POC system ~40 s):
#: every test using one is ``slow`` (see :func:`pytest_collection_modifyitems`)
SLOW_FIXTURES = {"flare_runs"}


#: the files that take longest on 2 idle cores (``--durations``), run first under ``pytest -n 2``
#: so that no worker ends the run alone with one of them; a stale entry costs time, never a result
LONGEST_FIRST = (
    "tests/flare/test_poc_faults.py",  # two POC systems, a site and a server killed (~3 min)
    "tests/flare/test_readme_flare.py",
    "tests/flare/test_controller.py",  # the shared FLARE simulator jobs (tests/flare/shared_job.py)
    "tests/flare/test_job.py",
    "tests/commands/test_use_the_model.py",
    "tests/flare/test_stats.py",
    "tests/benchmarks/test_bench_speed.py",
    "tests/pipeline/test_site_workers.py",
    "tests/commands/test_bundle.py",
    "tests/flare/test_cross_site.py",
    # the fast tier's longest files (worker-seconds under `-m "not slow"`): started first, so that a
    # worker does not end the fast tier alone with one of them
    "tests/pipeline/protocols/test_protocols.py",  # every method trains (~50 s)
    "tests/hostile/test_ingest_hostile.py",
    "tests/pipeline/test_authors_loop.py",
    "tests/pipeline/protocols/test_target_combine.py",
    "tests/commands/test_sweep.py",
    "tests/hostile/test_run_directories.py",
    "tests/evaluation/test_cli.py",
    "tests/evaluation/test_report.py",
    "tests/commands/test_stats.py",
    "tests/pipeline/protocols/test_faithfulness.py",
    "tests/commands/test_demo.py",
    "tests/pipeline/protocols/test_fedopt.py",
)


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test that uses a fixture of :data:`SLOW_FIXTURES`; on an xdist worker,
    put the files of :data:`LONGEST_FIRST` first.

    The fast tier, ``pytest -m "not slow"``, is for everyday work; the whole suite (the README's
    test command, run by CI) still runs every slow test.

    ``pytest -n 2`` hands out whole files in the order the workers collected them (``--dist
    loadfile --no-loadscope-reorder`` in pyproject.toml), so sorting the collection here decides
    which files start first. Every worker sorts the same collection the same way (a stable sort
    by file), as xdist requires; one process (``-n 0``) keeps the files' own order."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread_per_test_process():
    """Each test process computes on one torch thread, the count fedcxr's own runs and evaluations use
    (``engine.threads``, auto 1: README "Thread policy and speed"). torch's default is one thread per
    core: under ``pytest -n 2`` on 2 cores that is four threads on two cores, and every test running
    torch outside a run's thread policy (a ``SiteRunner`` or a model called directly, a bundle, a
    checkpoint check) waited on OpenMP threads spinning for a core: tests/pipeline/test_site_runner.py
    took 42 s of CPU at two threads and 13 s at one on a busy 2-core machine. Runs set their own count
    (``backend_settings``), tests that need another one set it, and :func:`_torch_threads_restored` puts
    this one back after each test. Processes the tests start keep torch's default."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Every test leaves torch's thread count as it found it. A benchmark's ``main`` sets it (its
    ``--threads``); leaked into later tests, the pytest process trains with another thread count
    than the subprocesses it compares with (FLARE clients, a killed ``fedcxr train``), and float
    sums in another order break their bit-identical checks."""
    import torch

    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def one_torch_thread():
    """Tiny networks run faster on one thread, and far faster when other jobs share the cores."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --------------------------------------------------------------------------- built once per run


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that ``build(folder)`` fills once per test run, shared by every xdist worker.

    A session fixture runs once per *worker*: under ``pytest -n 2`` each worker would build the same
    tiny federation (or demo) again, seconds of CPU for nothing. This is pytest-xdist's documented
    way to run a session fixture once ("Making session-scoped fixtures execute only once"): the
    first worker builds under a file lock in the run's shared temporary folder (the workers'
    ``basetemp`` parent), the others wait for it and reuse the folder. Without xdist (``-n 0``)
    the folder is the session's own, as before. Such a folder is read-only for tests (each copies
    what it changes), as it already was for the tests sharing it in one worker; a build that
    failed part way is started again from an empty folder."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent
    root, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            build(root)
            done.touch()
    return root


# --------------------------------------------------------------------------- a tiny federation


#: the image size of :func:`tiny_config`; the session decodes the tiny federation once at it
TINY_IMAGE_SIZE = 32


@pytest.fixture(scope="session")
def tiny_manifests(tmp_path_factory) -> Path:
    """Four synthetic hospitals (48 images each, 32 px) ingested into ``<tmp>/manifests``.

    Their images are also decoded once, at :data:`TINY_IMAGE_SIZE`, into ``<tmp>/cache`` (the
    session's image cache): :func:`tiny_config` seeds each test's own cache folder from it, so
    some 80 tests no longer decode the same 192 images again. Built once per test run, whatever
    the number of xdist workers (:func:`built_once`)."""
    from fedcxr.pipeline.data import cache_images, load_site
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    def build(root: Path) -> None:
        write_synthetic_export(root / "export", images_per_site=48, image_size=32, seed=1)
        ingest_synthetic(root / "export", root / "manifests", progress=False)
        for site in sorted((root / "manifests").iterdir()):
            if (site / "manifest.parquet").is_file():
                cache_images(load_site(site), TINY_IMAGE_SIZE, _session_cache(root / "manifests"), progress=False)

    return built_once(tmp_path_factory, "federation", build) / "manifests"


def _session_cache(manifests: Path) -> Path:
    return Path(manifests).parent / "cache"


def seed_cache(manifests: Path, cache: Path) -> None:
    """Copy the session's decoded images of ``manifests`` into the test's ``cache`` folder when it
    holds none yet (a copy, not a link: a test that damages its cache harms no other test). The
    cache files are keyed by manifest content hash and size, so a copy is exactly what decoding
    would write; runs at another image size decode as usual."""
    shared, cache = _session_cache(manifests), Path(cache)
    if not shared.is_dir() or shared.resolve() == cache.resolve() or any(cache.glob("*.u8")):
        return
    cache.mkdir(parents=True, exist_ok=True)
    for path in shared.iterdir():
        if path.suffix in (".u8", ".json") and path.is_file():
            shutil.copyfile(path, cache / path.name)


def tiny_config(manifests: Path, cache: Path, **overrides) -> dict:
    """A config small enough for a 2-core test: resnet_tiny at 32 px, two short rounds.

    ``cache`` is the test's image cache folder, seeded from the session's decoded images
    (:func:`seed_cache`)."""
    seed_cache(manifests, cache)
    data = {
        "name": "tiny",
        "manifests": str(manifests),
        "sites": ["nih_style", "chexpert_style"],
        "target": "dicom_style",
        "strategy": "FedAvg_Finetune",
        "rounds": 2,
        "source": {"lr": 2e-3, "batch_size": 16, "steps": 2},
        "target_train": {"lr": 1e-3, "batch_size": 16, "steps": 2, "labeled": 0.5},
        "model": {"backbone": "resnet_tiny", "hidden": 16},
        "image_size": TINY_IMAGE_SIZE,
        "augment": False,
        "device": "cpu",
        "seed": 0,
        "cache_dir": str(cache),
        "eval_every": 1,
        "surgical": {"head_warmup": {"epochs": 1}},  # FL family: one head-only epoch (the default 15 is the paper's)
    }
    for key, value in overrides.items():
        data[key] = value
    return data
