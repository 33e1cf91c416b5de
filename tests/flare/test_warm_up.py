"""MONAI imported while a FLARE process waits (``fedcxr.flare.warm_up``): in the background, once, and
joined before the process does anything else."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("nvflare")

from fedcxr.flare import warm_up  # noqa: E402


@pytest.fixture
def fresh(monkeypatch):
    """No warm-up started yet in this process."""
    monkeypatch.setattr(warm_up, "_thread", None)
    return warm_up


def test_start_imports_in_a_background_thread_once_and_finish_waits_for_it(fresh, tmp_path, monkeypatch):
    (tmp_path / "slow_to_import.py").write_text("import time, threading\ntime.sleep(0.3)\n"
                                                "IMPORTED_IN = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_to_import", raising=False)
    assert fresh.start(("slow_to_import",)) is True
    assert fresh.start(("slow_to_import",)) is False  # once per process
    fresh.finish()
    assert sys.modules["slow_to_import"].IMPORTED_IN == "fedcxr-warm-up"


def test_nothing_starts_for_modules_already_imported_and_a_failed_import_is_left_to_the_process(fresh):
    assert fresh.start(("json",)) is False
    assert fresh.start(("no_such_module_fedcxr",)) is True
    fresh.finish()  # no exception here: the process's own import says what is wrong, where it needs it
    assert "no_such_module_fedcxr" not in sys.modules


def test_a_site_imports_while_it_waits_for_its_next_task_and_never_while_it_works(fresh, monkeypatch):
    """The order in a site's Client API loop: the import starts right after a reply is sent (the site
    then only waits) and is joined as soon as the next task arrives, before the task is handled."""
    from fedcxr.flare import client
    from fedcxr.flare.wire import encode_task
    from fedcxr.pipeline.messages import Reply

    events = []
    monkeypatch.setattr(warm_up, "start", lambda *a, **k: events.append("warm-up start"))
    monkeypatch.setattr(warm_up, "finish", lambda: events.append("warm-up finish"))
    monkeypatch.setattr(client, "_site_writer", lambda: None)
    params, meta = encode_task("metadata", None, None, runner={}, run="r")
    tasks = [SimpleNamespace(params=params, meta=meta)] * 2

    class Api:
        def is_running(self):
            return True

        def receive(self):
            events.append("receive")
            return tasks.pop(0) if tasks else None

        def get_task_name(self):
            return "metadata"

        def send(self, model):
            events.append("send")

    class Site:
        name, site_cfg = "site_a", SimpleNamespace(secure_aggregation=None)

        def open_params(self, params):
            return params, 0.0

        def handle(self, *args):
            events.append("handle")
            return Reply(site=self.name, n_samples=3)

        def streams(self, *args):
            return None

    assert client.serve(Api(), Site()) == 2
    assert events == ["receive", "warm-up finish", "handle", "send", "warm-up start",
                      "receive", "warm-up finish", "handle", "send", "warm-up start",
                      "receive", "warm-up finish"]


def test_the_server_imports_while_its_task_is_out_and_joins_before_it_goes_on(fresh, monkeypatch):
    from fedcxr.flare.controller import FlareTransport

    events = []
    monkeypatch.setattr(warm_up, "start", lambda *a, **k: events.append("warm-up start"))
    monkeypatch.setattr(warm_up, "finish", lambda: events.append("warm-up finish"))

    class Controller:
        task_timeout, last_wait = 0, 0

        def dispatch(self, task, groups, *, round_, timeout):
            events.append("dispatch")
            return {}

    transport = FlareTransport(Controller(), ["site_a"], runner={}, run="r")
    transport.run("metadata", ["site_a"], None, None)
    assert events == ["warm-up start", "dispatch", "warm-up finish"]
