"""``benchmarks/suite_cpu.py``: CPU per test with the processes a test starts, orphans included."""

from __future__ import annotations

import sys
import textwrap

import pytest

from .conftest import load_bench


def test_files_are_ranked_by_cpu_and_the_report_names_the_heaviest_test():
    bench = load_bench("suite_cpu")
    rows = [(1.0, 2.0, "tests/a.py::t1"), (3.0, 1.0, "tests/b.py::t"), (0.5, 0.5, "tests/a.py::t2")]
    assert bench.by_file(rows) == [("tests/b.py", 1, 3.0, 1.0), ("tests/a.py", 2, 1.5, 2.5)]
    lines = bench.report(rows, top=1)
    assert lines[0].startswith("3 tests: 4.5 CPU-seconds") and "NOT counted" not in lines[0]
    assert lines[3].split() == ["3.0", "1.0", "1", "tests/b.py"] and lines[-1].split()[-1] == "tests/b.py::t"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child subreaper is Linux's prctl")
def test_the_cpu_of_a_process_the_test_abandoned_is_counted(tmp_path):
    """A grandchild whose parent exits at once (as FLARE's POC scripts detach theirs) still counts."""
    bench = load_bench("suite_cpu")
    (tmp_path / "test_orphan.py").write_text(textwrap.dedent('''
        import subprocess, sys, time
        BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass"
        def test_orphan():
            subprocess.run([sys.executable, "-c",
                            f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {BURN!r}])"])
            time.sleep(1.5)  # the orphan finishes meanwhile; the plugin reaps it
    '''))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "cpu.tsv"
    assert bench.main(["--out", str(out), "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
                       "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_orphan.py")]) == 0
    (cpu, wall, node), = bench.read_rows(out)
    assert node.endswith("test_orphan.py::test_orphan") and cpu >= 0.6 and wall >= 1.5
