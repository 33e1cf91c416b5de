"""Which sites a FLARE task asks, how long it waits, why a site is absent (issue 31; :mod:`fedcxr.flare.liveness`).

The end-to-end behaviour on a POC system is in ``test_poc_faults.py``; these are its pieces, fast.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from fedcxr.flare.liveness import DISCONNECTED, STARTUP_ALLOWANCE_S, SiteLiveness


def test_a_site_flare_deemed_disconnected_is_not_asked_and_is_logged_once(caplog):
    gone = {"b": 1.0}
    liveness = SiteLiveness(gone.get, task_timeout=20)
    with caplog.at_level(logging.WARNING, logger="fedcxr.flare.liveness"):
        assert liveness.split(["a", "b", "c"], what="round 3 (task train)") == (["a", "c"], ["b"])
        assert liveness.split(["a", "b"]) == (["a"], ["b"])
    assert liveness.reason("b") == DISCONNECTED and liveness.reason("a") is None
    assert caplog.text.count("site b: FLARE deemed its client disconnected") == 1
    assert "from round 3 (task train) on it is not asked" in caplog.text
    gone.clear()  # the client is heard from again (FLARE's CLIENT_RECONNECTED): asked again
    with caplog.at_level(logging.INFO, logger="fedcxr.flare.liveness"):
        assert liveness.split(["a", "b"]) == (["a", "b"], [])
    assert "site b: its FLARE client is connected again" in caplog.text


def test_a_broken_flare_verdict_never_stops_a_round():
    def broken(site):
        raise KeyError(site)

    assert SiteLiveness(broken, task_timeout=5).split(["a"]) == (["a"], [])


def test_a_sites_tasks_up_to_its_first_round_get_the_start_up_allowance_then_the_timeout():
    """Issue 31: a tight --timeout lost round 1 while the sites' job processes were still starting."""
    liveness = SiteLiveness(lambda site: None, task_timeout=4)
    assert liveness.timeout(["a", "b"]) == 4 + STARTUP_ALLOWANCE_S  # the metadata query: no round
    assert liveness.timeout(["a", "b"], 0) == 4 + STARTUP_ALLOWANCE_S  # their first round
    assert liveness.timeout(["a", "b"], 1) == 4
    assert liveness.timeout(["a", "target"], 1) == 4 + STARTUP_ALLOWANCE_S  # the target's first task of a round
    assert liveness.timeout(["target"], 2) == 4
    assert SiteLiveness(lambda site: None, task_timeout=0).timeout(["a"]) == 0, "0 stays: no limit"


def test_an_unanswered_site_gets_its_reason():
    gone: dict = {}
    liveness = SiteLiveness(gone.get, task_timeout=20)
    liveness.note_unanswered(["a"], 20)
    assert liveness.reason("a") == "no answer within 20 s"
    gone["a"] = 1.0  # FLARE deemed it disconnected while the task waited
    liveness.note_unanswered(["a"], 20)
    assert liveness.reason("a") == DISCONNECTED
    liveness.note_unanswered(["c"], 0)
    assert liveness.reason("c") == "no answer"


# --------------------------------------------------------------------------- the controller's use of it


class _Signal:
    triggered = False


def _controller(task_timeout: int, gone: dict, answering: set):
    pytest.importorskip("nvflare")
    from nvflare.app_common.abstract.fl_model import FLModel

    from fedcxr.flare.controller import FedcxrController

    controller = FedcxrController(task_timeout=task_timeout)
    controller.liveness.disconnect_time = gone.get
    controller.abort_signal = _Signal()
    controller.sent = []

    def send_model_and_wait(task_name, data, targets, timeout):
        controller.sent.append(SimpleNamespace(task=task_name, targets=list(targets), timeout=timeout))
        return [FLModel(params={}, meta={"client_name": s}) for s in targets if s in answering]

    controller.send_model_and_wait = send_model_and_wait
    return controller


def test_the_controller_sends_only_to_connected_sites_and_records_why_the_others_are_absent():
    """Issue 31: every round after a site's death waited the full --timeout although FLARE knew it was gone."""
    from fedcxr.flare.controller import FlareTransport

    gone: dict = {}
    controller = _controller(20, gone, answering={"a"})
    transport = FlareTransport(controller, ["a", "b"], runner={}, run="fp")
    groups = [(["a", "b"], ({}, {}))]
    assert set(controller.dispatch("train", groups, round_=0)) == {"a"}
    assert controller.sent[-1].targets == ["a", "b"] and controller.sent[-1].timeout == 20 + STARTUP_ALLOWANCE_S
    assert transport.absence_reason("b") == "no answer within 140 s"
    gone["b"] = 1.0
    assert set(controller.dispatch("train", groups, round_=1)) == {"a"}
    assert controller.sent[-1].targets == ["a"] and controller.sent[-1].timeout == 20
    assert transport.absence_reason("b") == DISCONNECTED
    sent = len(controller.sent)
    assert controller.dispatch("train", [(["b"], ({}, {}))], round_=2) == {}  # nobody left to ask: no task
    assert len(controller.sent) == sent


def test_an_aborted_job_stops_the_run_instead_of_completing_the_round_with_what_arrived():
    from fedcxr.flare.controller import JobAborted

    controller = _controller(20, {"b": 1.0}, answering={"a"})
    original = controller.send_model_and_wait

    def aborted_meanwhile(**kwargs):
        controller.abort_signal.triggered = True
        return original(**kwargs)

    controller.send_model_and_wait = aborted_meanwhile
    with pytest.raises(JobAborted, match=r"the FLARE job was aborted .*deemed disconnected: b"):
        controller.dispatch("train", [(["a", "b"], ({}, {}))], round_=3)
