"""FedProx, SCAFFOLD and FedOpt through the in-process federation (fedcxr.pipeline.protocols.fedopt):
each round is its published rule on the sites' real replies, the *_Finetune variants give the target
FedAvg_Finetune's budget, refusals exit 2, and a killed run resumes bit-identical."""

from __future__ import annotations

import json

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as A
from fedcxr.pipeline.checkpoints import load_checkpoint, save_checkpoint
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.protocols.fedopt import unpack_control_delta
from fedcxr.pipeline.keys import CONTROL_PREFIX

from ...conftest import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SGD = {"lr": 5e-2, "batch_size": 16, "steps": 2}  # SCAFFOLD's sources: plain SGD needs a larger step than Adam


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One decoded-image cache for the module's runs (decoding is not what these tests are about)."""
    return tmp_path_factory.mktemp("fedopt_cache")


def _cfg(manifests, cache, **overrides):
    return load_config(data=tiny_config(manifests, cache, eval_every=0, **overrides))


def _final(run_dir) -> dict:
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _transport(cfg):
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
    from fedcxr.pipeline.devices import resolve_device

    return InProcessTransport(build_runners(cfg, resolve_device("cpu"), progress=False))


class _Spy:
    """The in-process transport, recording every task's configs and replies; ``crash_at``: dies like a
    killed process when a task of that round starts."""

    def __init__(self, inner, crash_at=None):
        self.inner, self.site_names, self.crash_at = inner, inner.site_names, crash_at
        self.calls = []

    def run(self, task, targets, params, config, *, per_site=None):
        configs = {s: (per_site or {}).get(s, (params, config))[1] for s in targets}
        if self.crash_at is not None and task != "evaluate" and self.crash_at in {c.get("round") for c in configs.values()}:
            raise KeyboardInterrupt("killed")
        replies = self.inner.run(task, targets, params, config, per_site=per_site)
        self.calls.append((task, configs, params, replies))
        return replies

    def local_states(self):
        return self.inner.local_states()

    def load_local_states(self, states):
        self.inner.load_local_states(states)


# --------------------------------------------------------------------------- each round is the published rule


def test_scaffold_first_round_is_fedavg_with_plain_sgd(tiny_manifests, cache, tmp_path):
    """c = c_i = 0 in round 0 and η_g = 1: SCAFFOLD's model is FedAvg's with plain-SGD sources, bit for bit."""
    run_experiment(_cfg(tiny_manifests, cache, strategy="SCAFFOLD", rounds=1, source=SGD), tmp_path / "s",
                   progress=False)
    run_experiment(_cfg(tiny_manifests, cache, strategy="FedAvg", rounds=1,
                        source={**SGD, "optimizer": "sgd", "momentum": 0.0}), tmp_path / "f", progress=False)
    assert _same(_final(tmp_path / "s")["global"], _final(tmp_path / "f")["global"])


def test_scaffold_round_updates_c_and_each_sites_c_i_as_algorithm_1(tiny_manifests, cache, tmp_path):
    cfg = _cfg(tiny_manifests, cache, strategy="SCAFFOLD", rounds=2, source=SGD, server_lr=0.5)
    spy = _Spy(_transport(cfg))
    run_experiment(cfg, tmp_path / "run", progress=False, transport=spy)
    (task0, configs0, payload0, replies0), (_, configs1, payload1, replies1) = [c for c in spy.calls
                                                                             if c[0] == "train_scaffold"]
    assert task0 == "train_scaffold" and all(c["optimizer"] == "sgd" and c["momentum"] == 0.0
                                             for c in configs0.values())
    x0 = {k: v for k, v in payload0.items() if not k.startswith("scaffold_c.")}
    c1 = {k[len("scaffold_c."):]: v for k, v in payload1.items() if k.startswith("scaffold_c.")}
    assert c1 and all(float(v.abs().max()) == 0 for k, v in payload0.items() if k.startswith("scaffold_c."))
    n = {s: r.n_samples for s, r in replies0.items()}
    deltas = {s: unpack_control_delta(r.extra) for s, r in replies0.items()}
    for site, reply in replies0.items():  # c = c_i = 0: Δc_i = c_i⁺ = (x − y_i)/(K·η_l)
        k = reply.metrics["scaffold_steps"]
        assert k == 2
        for key in ("backbone.conv1.weight", "head.bias"):
            torch.testing.assert_close(deltas[site][key], (x0[key] - reply.params[key]) / (k * SGD["lr"]))
    for key in c1:  # c ← c + (|S|/N)·Σ (n_i/Σn)·Δc_i with |S| = N
        expected = sum(deltas[s][key] * n[s] for s in n) / sum(n.values())
        torch.testing.assert_close(c1[key], expected, rtol=1e-5, atol=1e-7)
    kept = spy.inner.runners["nih_style"].local_state  # c_i stays at the site, after round 1 now
    assert {k for k in kept if k.startswith(CONTROL_PREFIX)} == {CONTROL_PREFIX + k for k in c1}
    final = _final(tmp_path / "run")
    assert all(not k.startswith(CONTROL_PREFIX) for state in final["local_states"].values() for k in state)
    assert set(replies1) == {"nih_style", "chexpert_style"} and not any(k.startswith("scaffold") for k in final["global"])
    bn = [k for k in x0 if k.endswith("running_mean")]
    assert bn and not set(bn) & set(c1), "BN running statistics carry no control variate"


def test_fedadam_round_is_the_server_optimiser_step_on_fedavgs_mean(tiny_manifests, cache, tmp_path):
    from fedcxr.pipeline.protocols.fedopt import FEDOPT_DEFAULTS

    for strategy, rounds in (("FedAvg", 0), ("FedAvg", 1), ("FedAdam", 1)):
        run_experiment(_cfg(tiny_manifests, cache, strategy=strategy, rounds=rounds),
                       tmp_path / f"{strategy}{rounds}", progress=False)
    theta0, mean = _final(tmp_path / "FedAvg0")["global"], _final(tmp_path / "FedAvg1")["global"]
    got = _final(tmp_path / "FedAdam1")["global"]
    lr, betas, tau = FEDOPT_DEFAULTS["adam"]
    keys = [k for k in theta0 if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    moments = {"m": {k: torch.zeros_like(theta0[k]) for k in keys}, "v": {k: torch.full_like(theta0[k], tau * tau)
                                                                          for k in keys}}
    expected, _ = A.fedopt(theta0, mean, moments, rule="adam", server_lr=lr, betas=betas, tau=tau, keys=keys)
    assert _same(got, expected)
    assert torch.equal(got["backbone.bn1.running_var"], mean["backbone.bn1.running_var"])  # averaged, not stepped
    assert not torch.equal(got["head.weight"], mean["head.weight"])


def test_fedprox_with_mu_zero_is_fedavg_and_its_default_mu_is_not(tiny_manifests, cache, tmp_path):
    for name, extra in (("avg", {"strategy": "FedAvg"}), ("mu0", {"strategy": "FedProx", "fedprox_mu": 0.0}),
                        ("mu", {"strategy": "FedProx", "fedprox_mu": 5.0})):
        run_experiment(_cfg(tiny_manifests, cache, rounds=1, **extra), tmp_path / name, progress=False)
    assert _same(_final(tmp_path / "avg")["global"], _final(tmp_path / "mu0")["global"])
    assert not _same(_final(tmp_path / "avg")["global"], _final(tmp_path / "mu")["global"])


def test_finetune_variants_give_the_target_fedavg_finetunes_budget(tiny_manifests, cache, tmp_path):
    """The map compares server rules: every *_Finetune target trains with FedAvg_Finetune's task config."""
    seen = {}
    for strategy in ("FedAvg_Finetune", "FedProx_Finetune", "SCAFFOLD_Finetune", "FedAdam_Finetune"):
        cfg = _cfg(tiny_manifests, cache, strategy=strategy, rounds=1, source=SGD)
        spy = _Spy(_transport(cfg))
        run_experiment(cfg, tmp_path / strategy, progress=False, transport=spy)
        seen[strategy] = [c["dicom_style"] for task, c, _, _ in spy.calls if "dicom_style" in c and task == "train"]
        metrics = json.loads((tmp_path / strategy / "metrics.jsonl").read_text().splitlines()[0])
        assert "target" in metrics
    reference = seen.pop("FedAvg_Finetune")
    assert len(reference) == 1 and reference[0]["labeled"] == 0.5 and reference[0]["optimizer"] == "adam"
    for strategy, configs in seen.items():
        assert configs == reference, strategy


# --------------------------------------------------------------------------- refusals (exit 2)


@pytest.mark.parametrize("overrides, message", [
    ({"strategy": "FedProx", "privacy": {"dp": {"noise_multiplier": 1.0}},
      "model": {"backbone": "resnet_tiny", "hidden": 16, "norm": "group"}}, "drops the proximal term"),
    ({"strategy": "SCAFFOLD", "source": {**SGD, "optimizer": "adam"}}, "plain SGD"),
    ({"strategy": "SCAFFOLD", "source": {**SGD, "momentum": 0.9}}, "plain SGD"),
    ({"strategy": "SCAFFOLD", "source": SGD, "privacy": {"filters": [{"exclude_vars": "head"}]}}, "unfiltered"),
    ({"strategy": "SCAFFOLD", "source": SGD, "backbone_aggregation": "fedbn"}, "backbone_aggregation: fedavg"),
    ({"strategy": "FedYogi_Finetune", "backbone_aggregation": "fedbn_plus"}, "backbone_aggregation: fedavg"),
])
def test_combinations_without_a_published_update_exit_2_saying_why(tiny_manifests, cache, tmp_path, overrides,
                                                                 message):
    with pytest.raises(UserError, match=message):
        run_experiment(_cfg(tiny_manifests, cache, **overrides), tmp_path / "run", progress=False)


def test_server_optimiser_settings_are_validated(tiny_manifests, cache):
    """Each option is checked in its method's block, named there; a former top-level key is named too."""
    with pytest.raises(UserError, match=r"fedopt.betas: each of β1, β2 must lie in \[0, 1\)"):
        _cfg(tiny_manifests, cache, strategy="FedAdam", fedopt={"betas": [0.9, 1.0]})
    with pytest.raises(UserError, match=r"fedopt.betas: .*\[0, 1\).*written as `server_betas`"):
        _cfg(tiny_manifests, cache, strategy="FedAdam", server_betas=[0.9, 1.0])
    for key, where in (("server_lr", "scaffold.server_lr"), ("server_lr", "fedopt.server_lr"),
                       ("server_tau", "fedopt.tau")):
        with pytest.raises(UserError, match=rf"{where}: .*written as `{key}`"):
            _cfg(tiny_manifests, cache, strategy="FedAdam", **{key: 0})
    with pytest.raises(UserError, match="fedprox.mu: .*written as `fedprox_mu`"):
        _cfg(tiny_manifests, cache, strategy="FedProx", fedprox_mu=-1)
    with pytest.raises(UserError, match="fedprox.mu: Input should be greater than or equal to 0$"):
        _cfg(tiny_manifests, cache, strategy="FedProx", fedprox={"mu": -1})


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("strategy, state_key", [("SCAFFOLD", "control"), ("FedAdam_Finetune", "server_opt")])
def test_a_killed_run_resumes_bit_identical_with_its_server_and_site_state(tiny_manifests, cache, tmp_path, strategy,
                                                                           state_key):
    cfg = _cfg(tiny_manifests, cache, strategy=strategy, rounds=2, source=SGD)
    run_experiment(cfg, tmp_path / "straight", progress=False, transport=_transport(cfg))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "killed", progress=False, transport=_Spy(_transport(cfg), crash_at=1))
    path = tmp_path / "killed" / "checkpoints" / "round_0000.pt"
    ckpt = load_checkpoint(path)
    assert ckpt["state"][state_key] and not (tmp_path / "killed" / "final_model.pt").exists()
    kept_ci = [k for state in ckpt["local_states"].values() for k in state if k.startswith(CONTROL_PREFIX)]
    assert bool(kept_ci) == (strategy == "SCAFFOLD")
    run_experiment(cfg, tmp_path / "killed", resume=True, progress=False, transport=_transport(cfg))  # fresh sites
    assert _same(_final(tmp_path / "straight")["global"], _final(tmp_path / "killed")["global"])
    if strategy == "SCAFFOLD":  # the sites' c_i come from the checkpoint: without them the run ends elsewhere
        ckpt["local_states"] = {s: {k: v for k, v in state.items() if not k.startswith(CONTROL_PREFIX)}
                                for s, state in ckpt["local_states"].items()}
        (tmp_path / "lost" / "checkpoints").mkdir(parents=True)
        save_checkpoint(tmp_path / "lost", 0, ckpt)
        (tmp_path / "lost" / "metrics.jsonl").write_text((tmp_path / "killed" / "metrics.jsonl").read_text())
        run_experiment(cfg, tmp_path / "lost", resume=True, progress=False, transport=_transport(cfg))
        assert not _same(_final(tmp_path / "straight")["global"], _final(tmp_path / "lost")["global"])


def test_the_scaffold_payload_and_reply_pack_and_unpack_exactly():
    """The train_scaffold task carries c beside the model; the reply carries Δc_i as extra tensors."""
    from fedcxr.pipeline.protocols.fedopt import pack_control, pack_control_delta, unpack_control

    theta = {"w": torch.tensor([1.0]), "b": torch.tensor([2.0])}
    control = {"w": torch.tensor([5.0])}
    model, c = unpack_control(pack_control(theta, control))
    assert model == theta and c == control
    extra = {**pack_control_delta({"w": torch.tensor([0.5])}), "other": torch.tensor([9.0])}
    assert list(extra)[0] == "scaffold_dc.w" and unpack_control_delta(extra) == {"w": extra["scaffold_dc.w"]}
