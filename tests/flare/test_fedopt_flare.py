"""SCAFFOLD and FedAdam on NVIDIA FLARE's simulator end with the in-process weights (DESIGN §8).

One simulator job runs both (a FLARE job costs ~15 s of start-up here). SCAFFOLD's round 1 uses
the control variates of round 0: the server's c travels in the task, each site's c_i stays in
the site's own state folder (never in the server's run directory), and Δc_i comes back in the
reply. FedAdam's moments live in the server's checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("nvflare")

from fedcxr.flare.simulator import simulate_many  # noqa: E402
from fedcxr.pipeline.checkpoints import load_checkpoint, load_tensors  # noqa: E402
from fedcxr.pipeline.config import config_fingerprint, load_config  # noqa: E402
from fedcxr.pipeline.run_driver import run_experiment  # noqa: E402
from fedcxr.pipeline.keys import CONTROL_PREFIX  # noqa: E402

from ..conftest import tiny_config  # noqa: E402

pytestmark = pytest.mark.slow  # one FLARE simulator job (~30 s on 2 cores)

SGD = {"lr": 5e-2, "batch_size": 16, "steps": 2}


def _final(run_dir: Path) -> dict:
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)


@pytest.fixture(scope="module")
def runs(tiny_manifests, tmp_path_factory):
    root = tmp_path_factory.mktemp("flare_fedopt")
    common = dict(rounds=2, eval_every=0, target=None)
    exps = {
        "SCAFFOLD": load_config(data=tiny_config(tiny_manifests, root / "cache", strategy="SCAFFOLD", source=SGD,
                                                 **common)),
        "FedAdam": load_config(data=tiny_config(tiny_manifests, root / "cache", strategy="FedAdam", **common)),
    }
    for name, cfg in exps.items():  # in-process references (this also fills the image cache)
        run_experiment(cfg, root / f"{name}-in-process", progress=False)
    payloads = simulate_many([(cfg, root / name) for name, cfg in exps.items()], progress=False, timeout=600,
                             evaluation={"enabled": False})
    return exps, root, dict(zip(exps, payloads))


@pytest.mark.parametrize("name", ["SCAFFOLD", "FedAdam"])
def test_flare_simulator_ends_with_the_in_process_weights(runs, name):
    exps, root, payloads = runs
    assert payloads[name]["missed"] == [], "a site that timed out changes the weights: say so first"
    assert _max_diff(_final(root / name)["global"], _final(root / f"{name}-in-process")["global"]) <= 1e-5


def test_server_state_is_checkpointed_and_each_sites_c_i_stays_at_the_site(runs):
    exps, root, _ = runs
    server = load_checkpoint(root / "SCAFFOLD" / "checkpoints" / "round_0001.pt")
    reference = load_checkpoint(root / "SCAFFOLD-in-process" / "checkpoints" / "round_0001.pt")
    assert _max_diff(server["state"]["control"], reference["state"]["control"]) <= 1e-5
    assert server["local_states"] == {}, "FLARE sites keep their own state: none of it reaches the server"
    run = config_fingerprint(exps["SCAFFOLD"])
    for site in ("nih_style", "chexpert_style"):
        saved = load_tensors(root / "SCAFFOLD" / "flare" / "state" / site / run / "round_0001.pt")
        c_i = {k: v for k, v in saved.items() if k.startswith(CONTROL_PREFIX)}
        expected = {k: v for k, v in reference["local_states"][site].items() if k.startswith(CONTROL_PREFIX)}
        assert c_i and _max_diff(c_i, expected) <= 1e-5, site
    adam = load_checkpoint(root / "FedAdam" / "checkpoints" / "round_0001.pt")["state"]["server_opt"]
    assert set(adam) == {"m", "v"} and adam["m"]
