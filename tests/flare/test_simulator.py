"""When ``fedcxr flare simulate`` stops waiting for FLARE's simulator (the runs themselves are in
``test_controller.py``, ``test_job.py`` and ``test_stats.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("nvflare")

from fedcxr.flare.simulator import SERVER_APP_ENDED, server_app_ended  # noqa: E402


def test_the_end_of_the_server_app_is_the_file_nvflares_simulator_writes_then(tmp_path):
    """The simulator writes its cell statistics right after its server app returns (the run over, its
    outputs on disk); the name must stay NVFLARE's, or fedcxr would wait through FLARE's grace again."""
    from nvflare.private.fed.app.simulator import simulator_runner

    assert SERVER_APP_ENDED == Path("server") / simulator_runner.POOL_STATS_DIR / simulator_runner.SIMULATOR_POOL_STATS
    assert not server_app_ended(tmp_path)
    (tmp_path / SERVER_APP_ENDED).parent.mkdir(parents=True)
    (tmp_path / SERVER_APP_ENDED).write_text("{}")
    assert server_app_ended(tmp_path)
