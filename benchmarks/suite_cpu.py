"""Where the test suite's CPU goes: CPU seconds per test and per file, child processes included.

The suite's budget (README: fast tier 2 min, whole suite 5 min on 2 idle cores) is a CPU budget:
two pytest-xdist workers can spend at most 2 × the wall time. Wall time per test (pytest's
``--durations``) hides the cost of the processes a test starts — NVIDIA FLARE's simulator and
POC processes, ``fedcxr`` commands run as subprocesses — and counts the waiting of tests that only
wait. This runs pytest in one process (``-n 0``) as a Linux *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``), so every descendant a test starts, also one its parent
abandoned (FLARE's POC scripts detach their processes), is reaped here and its CPU lands in
``RUSAGE_CHILDREN``; the plugin reads that and this process's own CPU before and after every test.
A process still running when its test ends is counted in a later test (FLARE tests stop theirs).
On a system without ``prctl`` orphans are not counted, and the report says so.

    python benchmarks/suite_cpu.py tests/flare                      # per file, then the top tests
    python benchmarks/suite_cpu.py -m "not slow" --out runs/fast_cpu.tsv

Any argument is passed to pytest (after ``-n 0 -p suite_cpu``). Measured this way on 2026-11-29:
``tests/flare`` 643 CPU-seconds, the fast tier 243 (README, "The test suite").
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Optional

REPO = Path(__file__).resolve().parents[1]
PR_SET_CHILD_SUBREAPER = 36
OUT_ENV = "FEDCXR_SUITE_CPU_OUT"


def become_subreaper() -> bool:
    """Make this process the reaper of every orphaned descendant (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def cpu_so_far() -> float:
    """This process's CPU plus every reaped descendant's (orphans reaped first, without blocking)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# --------------------------------------------------------------------------- the pytest plugin (-p suite_cpu)

_ROWS: list[tuple[float, float, str]] = []


def pytest_configure(config) -> None:
    """Only under :func:`main` (its environment variable): a plain ``-p suite_cpu`` changes nothing."""
    if os.environ.get(OUT_ENV):
        become_subreaper()


try:
    import pytest
except ImportError:  # the report side needs no pytest
    pytest = None

if pytest is not None:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """Setup, call and teardown of one test, timed together."""
        cpu, wall = cpu_so_far(), time.time()
        yield
        _ROWS.append((cpu_so_far() - cpu, time.time() - wall, item.nodeid))


def pytest_sessionfinish(session) -> None:
    out = os.environ.get(OUT_ENV)
    if out:
        with open(out, "a", encoding="utf-8") as f:
            for cpu, wall, node in _ROWS:
                f.write(f"{cpu:.2f}\t{wall:.2f}\t{node}\n")


# --------------------------------------------------------------------------- the report


def read_rows(path: Path) -> list[tuple[float, float, str]]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        cpu, wall, node = line.split("\t", 2)
        rows.append((float(cpu), float(wall), node))
    return rows


def by_file(rows: Iterable[tuple[float, float, str]]) -> list[tuple[str, int, float, float]]:
    """``(file, tests, CPU s, wall s)`` per test file, the most CPU first."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for cpu, wall, node in rows:
        entry = sums[node.split("::", 1)[0]]
        entry[0] += 1
        entry[1] += cpu
        entry[2] += wall
    return sorted(((f, int(n), c, w) for f, (n, c, w) in sums.items()), key=lambda r: (-r[2], r[0]))


def report(rows: list[tuple[float, float, str]], *, top: int = 15, counted_orphans: bool = True) -> list[str]:
    total_cpu, total_wall = sum(r[0] for r in rows), sum(r[1] for r in rows)
    lines = [f"{len(rows)} tests: {total_cpu:.1f} CPU-seconds (children included), {total_wall:.1f} s of wall time "
             f"run one at a time" + ("" if counted_orphans else " — orphaned processes NOT counted (no prctl)"),
             "", f"{'CPU s':>8} {'wall s':>8} {'tests':>5}  file"]
    lines += [f"{c:>8.1f} {w:>8.1f} {n:>5}  {f}" for f, n, c, w in by_file(rows)[:top]]
    lines += ["", f"{'CPU s':>8} {'wall s':>8}  test"]
    lines += [f"{c:>8.2f} {w:>8.2f}  {node}" for c, w, node in sorted(rows, key=lambda r: -r[0])[:top]]
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="keep the per-test TSV here (default: a temp file)")
    parser.add_argument("--top", type=int, default=15, help="files and tests listed")
    args, pytest_args = parser.parse_known_args(argv)
    out = args.out or Path(os.environ.get("TMPDIR", "/tmp")) / f"suite_cpu_{os.getpid()}.tsv"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    env = {**os.environ, OUT_ENV: str(out.resolve()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent),
                                                       os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "suite_cpu", *pytest_args],
                          cwd=REPO, env=env)
    if not out.is_file():
        print(f"suite_cpu: no test ran (pytest exit {done.returncode})", file=sys.stderr)
        return done.returncode or 1
    print("\n".join(report(read_rows(out), top=args.top, counted_orphans=sys.platform.startswith("linux"))))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
