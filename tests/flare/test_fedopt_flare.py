"""SCAFFOLD and FedAdam on NVIDIA FLARE's simulator end with the in-process weights (DESIGN §8).

Both run in the simulator job this folder's tests share (``flare_runs`` in ``conftest.py``).
SCAFFOLD's round 1 uses the control variates of round 0: the server's c travels in the task,
each site's c_i stays in the site's own state folder (never in the server's run directory), and
Δc_i comes back in the reply. FedAdam's moments live in the server's checkpoints.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nvflare")

from fedcxr.pipeline.checkpoints import load_checkpoint, load_tensors  # noqa: E402
from fedcxr.pipeline.config import config_fingerprint  # noqa: E402
from fedcxr.pipeline.keys import CONTROL_PREFIX  # noqa: E402

from .conftest import final_model, max_diff  # noqa: E402


@pytest.mark.parametrize("name", ["SCAFFOLD", "FedAdam"])
def test_flare_simulator_ends_with_the_in_process_weights(flare_runs, in_process_refs, name):
    assert flare_runs.payloads[name]["missed"] == [], "a site that timed out changes the weights: say so first"
    assert max_diff(final_model(flare_runs.dirs[name])["global"], final_model(in_process_refs(name))["global"]) <= 1e-5


def test_server_state_is_checkpointed_and_each_sites_c_i_stays_at_the_site(flare_runs, in_process_refs):
    run_dir, flare_dir = flare_runs.dirs["SCAFFOLD"], flare_runs.flare_dir
    server = load_checkpoint(run_dir / "checkpoints" / "round_0001.pt")
    reference = load_checkpoint(in_process_refs("SCAFFOLD") / "checkpoints" / "round_0001.pt")
    assert max_diff(server["state"]["control"], reference["state"]["control"]) <= 1e-5
    assert server["local_states"] == {}, "FLARE sites keep their own state: none of it reaches the server"
    run = config_fingerprint(flare_runs.exps["SCAFFOLD"])
    for site in ("nih_style", "chexpert_style"):
        saved = load_tensors(flare_dir / "state" / site / run / "round_0001.pt")
        c_i = {k: v for k, v in saved.items() if k.startswith(CONTROL_PREFIX)}
        expected = {k: v for k, v in reference["local_states"][site].items() if k.startswith(CONTROL_PREFIX)}
        assert c_i and max_diff(c_i, expected) <= 1e-5, site
    adam = load_checkpoint(flare_runs.dirs["FedAdam"] / "checkpoints" / "round_0001.pt")["state"]["server_opt"]
    assert set(adam) == {"m", "v"} and adam["m"]
