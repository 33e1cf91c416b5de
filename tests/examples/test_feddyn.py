"""A method outside fedcxr (examples/methods/feddyn.py) loads by its file, with no change to fedcxr.

The README's "Your own method" walks through this file; these tests hold it to what it says: it
loads by ``method: path/to/file.py:Name`` (relative to the config's folder), its options block is
checked, its site task is the sites' (in-process and in worker processes), its rule is FedDyn's.
The FLARE simulator run is in ``tests/flare/test_methods_flare.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fedcxr.errors import UserError
from fedcxr.pipeline.config import config_fingerprint, load_config
from fedcxr.pipeline.protocols import Context, get_protocol
from fedcxr.pipeline.run_driver import run_experiment

from ..conftest import tiny_config

REPO = Path(__file__).resolve().parents[2]
FEDDYN = REPO / "examples" / "methods" / "feddyn.py"


def _config_file(tmp_path: Path, manifests: Path, **extra) -> Path:
    """A config next to a copy of the example: ``method: methods/feddyn.py:FedDyn``, as a user writes it."""
    (tmp_path / "methods").mkdir(exist_ok=True)
    (tmp_path / "methods" / "feddyn.py").write_text(FEDDYN.read_text())
    data = tiny_config(manifests, tmp_path / "cache", sites=["nih_style", "chexpert_style"], target=None,
                       rounds=2, eval_every=0)
    data.pop("strategy")
    data.update({"method": "methods/feddyn.py:FedDyn", "feddyn": {"alpha": 0.1}, **extra})
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_method_loads_from_its_file_beside_the_config_with_its_options(tiny_manifests, tmp_path):
    cfg = load_config(_config_file(tmp_path, tiny_manifests))
    assert cfg.method == f"{(tmp_path / 'methods' / 'feddyn.py').resolve()}:FedDyn"
    assert cfg.method_name == "FedDyn" and cfg.options("feddyn").alpha == 0.1
    assert get_protocol(cfg.method).name == "FedDyn"
    with pytest.raises(UserError, match=r"feddyn.alpha: Input should be greater than 0"):
        load_config(_config_file(tmp_path, tiny_manifests, feddyn={"alpha": 0}))
    with pytest.raises(UserError, match=r"feddyn.beta: Extra inputs are not permitted"):
        load_config(_config_file(tmp_path, tiny_manifests, feddyn={"beta": 1}))
    plain = load_config(data={"sites": ["a"]}, check_sites=False)  # a built-in method's config has no such block
    assert "feddyn" not in plain.model_dump()
    with pytest.raises(UserError, match="feddyn: Extra inputs are not permitted"):
        load_config(data={"sites": ["a"], "feddyn": {"alpha": 0.1}}, check_sites=False)


def test_its_server_reads_the_mean_so_secure_aggregation_refuses_it(tiny_manifests, tmp_path):
    """FedDyn's h is computed from the sites' mean: under privacy.secure_aggregation the server holds only a
    ciphertext of it, so the method says so (``reads_each_update``) instead of inheriting FedAvg's None."""
    blind = {"norm_factor": None, "norm_limit": None, "bn_factor": None, "check_variance": False}
    cfg = load_config(_config_file(tmp_path, tiny_manifests, privacy={"secure_aggregation": "he"}, defences=blind))
    with pytest.raises(UserError, match="method FedDyn corrects the sites' mean by its state h, computed from that "
                                        "mean in the clear, which an encrypted update hides"):
        get_protocol(cfg.method).validate_secure_aggregation(cfg)


class _Fixed:
    """Each source answers its ``train_feddyn`` task with fixed weights (no data)."""

    def __init__(self, answers):
        self.answers, self.site_names, self.tasks = answers, list(answers), []

    def run(self, task, targets, params, config, *, per_site=None):
        from fedcxr.pipeline.messages import Reply

        self.tasks.append((task, dict(config)))
        return {s: Reply(site=s, params={"w": torch.tensor(self.answers[s])}, n_samples=10, n_batches=1,
                         class_set=["edema"]) for s in targets if s in self.answers}


def test_the_server_rule_is_feddyns_algorithm_1(tmp_path, monkeypatch):
    """h^t = h^{t−1} − α·(1/m)·Σ_{k∈P_t}(θ_k − θ^{t−1}); θ^t = mean_{k∈P_t} θ_k − h^t/α — with one of
    three sources missing (m = 3, |P_t| = 2), over two rounds."""
    cfg = load_config(data={"sites": ["a", "b", "c"], "method": f"{FEDDYN}:FedDyn", "feddyn": {"alpha": 0.5},
                            "min_sites": 1}, check_sites=False)
    protocol = get_protocol(cfg.method)
    monkeypatch.setattr(sys.modules[type(protocol).__module__], "parameter_keys", lambda ctx: ["w"])
    transport = _Fixed({"a": [1.0, 2.0], "b": [3.0, 0.0]})
    ctx = Context(cfg=cfg, transport=transport, meta={}, classes=["edema"], aux_tasks=[], sources=["a", "b", "c"],
                  target=None)
    theta = {"w": torch.tensor([0.0, 0.0])}
    state = protocol.init_state(ctx, theta)
    state, _ = protocol.run_round(ctx, 0, state)
    mean = torch.tensor([2.0, 1.0])
    h = -0.5 * (2 / 3) * (mean - theta["w"])
    assert torch.allclose(state["feddyn_h"]["w"], h)
    assert torch.allclose(state["global"]["w"], mean - h / 0.5)
    previous = state["global"]["w"]
    state, _ = protocol.run_round(ctx, 1, state)
    h = h - 0.5 * (2 / 3) * (mean - previous)
    assert torch.allclose(state["global"]["w"], mean - h / 0.5)
    assert transport.tasks[0][0] == "train_feddyn" and transport.tasks[0][1]["dyn_alpha"] == 0.5


def test_a_sites_gradient_state_follows_the_update_and_stays_at_the_site(tiny_manifests, tmp_path):
    """∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α·(θ_k^t − θ^{t−1}), kept under a private prefix (never in final_model)."""
    from fedcxr.pipeline.devices import resolve_device
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners

    cfg = load_config(_config_file(tmp_path, tiny_manifests))
    transport = InProcessTransport(build_runners(cfg, resolve_device("cpu"), False))
    sent = []

    class Spy:
        site_names = transport.site_names

        def run(self, task, targets, params, config, *, per_site=None):
            replies = transport.run(task, targets, params, config, per_site=per_site)
            if task == "train_feddyn":
                sent.append((params, replies))
            return replies

        def local_states(self):
            return transport.local_states()

        def load_local_states(self, states):
            transport.load_local_states(states)

    run_experiment(cfg, tmp_path / "run", progress=False, transport=Spy())
    (theta0, first), (theta1, second) = sent
    kept = transport.runners["nih_style"].kept_state("method.feddyn.")
    assert kept and set(kept) <= set(theta0)
    for key, value in kept.items():
        expected = -0.1 * (first["nih_style"].params[key] - theta0[key]) - 0.1 * (
            second["nih_style"].params[key] - theta1[key])
        assert torch.allclose(value, expected, atol=1e-6), key
    final = torch.load(tmp_path / "run" / "final_model.pt", weights_only=True)
    assert not any(k.startswith("method.") for s in final["local_states"].values() for k in s)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["method"] == "FedDyn" and run["status"] == "finished"
    assert run["fingerprint"] == config_fingerprint(cfg)


@pytest.mark.slow
def test_worker_processes_load_the_file_and_give_the_same_weights(tiny_manifests, tmp_path):
    """``engine.site_workers: 2``: each worker process loads the method's file itself (a pickle of a
    function from a loaded file would not reach it) and the run ends with the sequential weights."""
    cfg = load_config(_config_file(tmp_path, tiny_manifests))
    run_experiment(cfg, tmp_path / "one", progress=False)
    workers = load_config(_config_file(tmp_path, tiny_manifests, engine={"site_workers": 2}))
    run_experiment(workers, tmp_path / "two", progress=False)
    a = torch.load(tmp_path / "one" / "final_model.pt", weights_only=True)["global"]
    b = torch.load(tmp_path / "two" / "final_model.pt", weights_only=True)["global"]
    assert all(torch.equal(a[k], b[k]) for k in a)
