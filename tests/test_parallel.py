"""fedcxr.parallel: chunks mapped in order, serially or in processes, with bounded memory and one bar policy."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from fedcxr.parallel import bounded_map, map_chunks


def scaled_sum(chunk, scale):
    """Module-level (process pools pickle it)."""
    return [scale * x for x in chunk] + [scale * sum(chunk)]


def test_map_chunks_gives_the_same_results_in_order_serially_and_in_processes():
    chunks = [list(range(i, i + 3)) for i in range(0, 30, 3)]
    serial = list(map_chunks(scaled_sum, chunks, 10, workers=1, progress=False, desc="t"))
    parallel = list(map_chunks(scaled_sum, chunks, 10, workers=2, progress=False, desc="t", in_flight=2))
    assert serial == parallel == [scaled_sum(c, 10) for c in chunks]
    assert list(map_chunks(scaled_sum, [], 10, workers=2, progress=False, desc="t")) == []


def test_map_chunks_shows_no_bar_off_a_terminal_or_when_progress_is_off(capsys):
    for progress in (True, False):  # pytest's stderr is not a terminal
        assert list(map_chunks(scaled_sum, [[1], [2]], 1, progress=progress, desc="quiet")) == [[1, 1], [2, 2]]
    assert "quiet" not in capsys.readouterr().err


def test_an_error_in_a_chunk_reaches_the_caller():
    with pytest.raises(TypeError):
        list(map_chunks(scaled_sum, [[1], ["a"]], None, workers=2, progress=False, desc="t"))


def test_bounded_map_keeps_order_and_at_most_limit_chunks_in_flight():
    submitted, consumed, peak = [], [], []

    def jobs():
        for k in range(20):
            submitted.append(k)
            peak.append(len(submitted) - len(consumed))
            yield k, k

    with ThreadPoolExecutor(max_workers=3) as pool:
        for key, value in bounded_map(pool, lambda job, scale: job * scale, jobs(), 10, limit=4):
            consumed.append(key)
            assert value == key * 10
    assert consumed == list(range(20))
    assert max(peak) <= 4 + 1  # the job being submitted plus at most `limit` waiting
