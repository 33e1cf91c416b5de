"""Secure aggregation's server side: FedAvg on ciphertexts, the checks left to the server, the key holder's
decryption — and the protocols run unchanged on sealed replies (in this process, as a FLARE run carries them)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from fedcxr.flare.sealing import LOCAL_BLOCK, MODEL_BLOCK, SealError, data_key, is_sealed, layout_key, open_sealed, seal
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.transport import Transport

from ..conftest import tiny_config
from .conftest import max_diff

#: FedAvg on CKKS ciphertexts against the plain float32 FedAvg: measured ~2e-7 on these states
TOLERANCE = 1e-5
#: the value checks a config must turn off to acknowledge that the server cannot read an update
BLIND = {"norm_factor": None, "norm_limit": None, "bn_factor": None, "check_variance": False}
#: The runs compared end to end train with plain SGD at a small lr. Training carries any difference of the
#: 7th digit far: adding noise of 1e-7 to every reply of these tiny runs moves the final model by 1.9e-3
#: with the default Adam (a gradient near 0 whose sign flips moves a weight by ±lr), 7.9e-2 with SGD at
#: lr 5e-2, 1.6e-5 with SGD at 1e-3 (README "Secure aggregation"). So each round's sum is checked exactly
#: against FedAvg of the same replies (:data:`ROUND_TOLERANCE`), the final models with the training's own
#: spread on top (:data:`FINAL_TOLERANCE`).
SGD = {"source": {"lr": 1e-3, "batch_size": 16, "steps": 2, "optimizer": "sgd", "momentum": 0.0},
       "target_train": {"lr": 1e-3, "batch_size": 16, "steps": 2, "labeled": 0.5, "optimizer": "sgd",
                        "momentum": 0.0}}
#: |sealed sum − FedAvg of the same replies| ≤ ROUND_TOLERANCE · (1 + |value|)
ROUND_TOLERANCE = 1e-6
#: |sealed run − plain run| of the final models ≤ FINAL_TOLERANCE · (1 + |value|)
FINAL_TOLERANCE = 1e-4


def relative_gap(a: dict, b: dict) -> float:
    """max |a − b| / (1 + |b|) over the entries (1 + |b|: absolute near 0, relative for large BN variances)."""
    assert a.keys() == b.keys()
    return max(float(((a[k].double() - b[k].double()).abs() / (1 + b[k].double().abs())).max()) for k in a
               if a[k].numel())


def _states(n: int = 3) -> list[dict]:
    torch.manual_seed(1)
    base = {"conv.weight": torch.randn(8, 1, 3, 3), "bn.weight": torch.ones(8), "bn.running_var": torch.rand(8) + 1,
            "bn.num_batches_tracked": torch.tensor(10), "head.weight": torch.randn(2, 5000)}
    out = []
    for i in range(n):
        state = {k: (v + 0.1 * torch.randn_like(v) if v.is_floating_point() else v + 2 * i) for k, v in base.items()}
        out.append(state)
    return out


def _aggregation(he_contexts):
    from fedcxr.flare.secure_aggregation import SealedAggregation

    return SealedAggregation(he_contexts.server)


def test_the_weighted_mean_of_sealed_models_is_fedavg(he_contexts):
    states, weights = _states(), [30.0, 10.0, 60.0]
    sealed = {f"s{i}": seal(s, he_contexts.client) for i, s in enumerate(states)}
    merged = _aggregation(he_contexts).weighted_mean(states[0], sealed, weights)
    assert is_sealed(merged) and set(merged) == {data_key(MODEL_BLOCK), layout_key(MODEL_BLOCK)}
    opened = open_sealed(merged, he_contexts.client)
    plain = agg.fedavg(states, weights)
    assert max_diff(opened, plain) < TOLERANCE
    assert int(opened["bn.num_batches_tracked"]) == int(plain["bn.num_batches_tracked"])  # (10·30+12·10+14·60)/100


def test_fedbn_keeps_the_servers_plain_batchnorm_beside_the_sealed_mean(he_contexts):
    states = _states(2)
    bn = ["bn.weight", "bn.running_var", "bn.num_batches_tracked"]
    sealed = {f"s{i}": seal(s, he_contexts.client, exclude=bn) for i, s in enumerate(states)}
    merged = _aggregation(he_contexts).weighted_mean(states[0], sealed, [1.0, 1.0])
    assert sorted(k for k in merged if not is_sealed({k: 0})) == sorted(bn)
    assert all(torch.equal(merged[k], states[0][k]) for k in bn)  # θ0's values, as fedbn leaves them
    opened = open_sealed(merged, he_contexts.client)
    assert max_diff({k: opened[k] for k in ("conv.weight", "head.weight")},
                    agg.fedbn(states, [1.0, 1.0], bn)) < TOLERANCE
    # the next round: θ0 is that sealed mean; the new one replaces its block
    again = _aggregation(he_contexts).weighted_mean(merged, sealed, [1.0, 3.0])
    assert set(again) == set(merged)
    # a new mean that leaves entries of θ0's block out cannot be built: the server cannot cut a ciphertext
    full = seal(states[0], he_contexts.client)
    with pytest.raises(SealError, match="does not hold .* of the previous one"):
        _aggregation(he_contexts).weighted_mean(full, sealed, [1.0, 1.0])


def test_what_the_server_still_checks_of_a_sealed_reply(he_contexts):
    from fedcxr.flare.secure_aggregation import SealedAggregation

    sealed_agg = SealedAggregation(he_contexts.server)
    theta0 = _states(1)[0]
    good = seal(theta0, he_contexts.client)
    assert sealed_agg.structure_problem(good, theta0) is None
    assert sealed_agg.structure_problem(seal(theta0, he_contexts.client, exclude=["bn.weight"]), theta0,
                                        local=["bn.weight"]) is None
    sealed_theta = sealed_agg.weighted_mean(theta0, {"a": good}, [1.0])  # a sealed reference: its layout counts
    assert sealed_agg.structure_problem(good, sealed_theta) is None
    problems = {
        "clear": {**good, "head.bias": torch.zeros(2)},
        "missing": seal({k: v for k, v in theta0.items() if k != "bn.weight"}, he_contexts.client),
        "shape": seal({**theta0, "head.weight": torch.zeros(3, 5000)}, he_contexts.client),
        "block": seal(theta0, he_contexts.client, block=LOCAL_BLOCK),
        "noise": {**good, data_key(MODEL_BLOCK): torch.zeros_like(good[data_key(MODEL_BLOCK)])},
    }
    reasons = {name: sealed_agg.structure_problem(params, theta0) for name, params in problems.items()}
    assert "came in the clear in a sealed reply" in reasons["clear"]
    assert "missing ['bn.weight']" in reasons["missing"]
    assert "sealed entry 'head.weight' has shape [3, 5000] float32, the model's [2, 5000] float32" in reasons["shape"]
    assert "must hold one block 'model'" in reasons["block"]
    assert "does not load under this HE context" in reasons["noise"]


def test_the_server_refuses_a_context_with_the_secret_key(he_contexts):
    from fedcxr.flare.secure_aggregation import SealedAggregation

    with pytest.raises(SealError, match="holds a secret key: the server must get server_context.tenseal only"):
        SealedAggregation(he_contexts.client)


# --------------------------------------------------------------------------- the protocols, unchanged, on ciphertexts


class SealingTransport(Transport):
    """The in-process sites behind what a FLARE site does under secure aggregation (open what comes, seal
    what goes: :class:`fedcxr.flare.client.FlareSite`); the server side sees ciphertexts only."""

    def __init__(self, inner: Transport, he_contexts, uniform: bool = False):
        from fedcxr.flare.secure_aggregation import SealedAggregation

        self.inner, self.client, self.uniform = inner, he_contexts.client, uniform
        self.site_names = list(getattr(inner, "site_names", []) or [])
        self.sealed = SealedAggregation(he_contexts.server)
        self.seen: list[dict] = []  # every reply's params as the server got them
        self.expected: dict = {}  # FedAvg, in the clear, of the last replies that carried models
        self.gaps: list[float] = []  # each sealed model sent out against that FedAvg (relative_gap)

    def _open(self, params):
        if not is_sealed(params):
            return params
        opened = open_sealed(params, self.client)
        block = {k for k in open_sealed({k: v for k, v in params.items() if k.startswith("sealed.")}, self.client)}
        if self.expected and block <= set(self.expected):
            self.gaps.append(relative_gap({k: opened[k] for k in block}, {k: self.expected[k] for k in block}))
        return opened

    def run(self, task, targets, params, config, *, per_site=None):
        opened = {s: (self._open(p), c) for s, (p, c) in (per_site or {}).items()}
        replies = self.inner.run(task, targets, self._open(params), config, per_site=opened or None)
        plain = {s: r for s, r in replies.items() if r.params is not None}
        if plain:
            local = set(getattr(config, "local_keys", ()) or ())
            states = [{k: v for k, v in r.params.items() if k not in local} for r in plain.values()]
            self.expected = agg.fedavg(states, [1.0 if self.uniform else float(max(r.n_samples, 1))
                                                for r in plain.values()])
        for site, reply in plain.items():
            task_config = (per_site or {}).get(site, (None, config))[1]
            reply.params = seal(reply.params, self.client, exclude=getattr(task_config, "local_keys", ()))
            self.seen.append(reply.params)
        return replies

    def local_states(self):
        return self.inner.local_states()

    def load_local_states(self, states):
        self.inner.load_local_states(states)

    def close(self):
        self.inner.close()


def _runs(tiny_manifests, tmp_path, he_contexts, **overrides):
    """The same experiment in this process, plain and with every reply sealed; their final models."""
    from fedcxr.flare.secure_aggregation import open_final
    from fedcxr.pipeline.checkpoints import load_final_model
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.inprocess import site_transport
    from fedcxr.pipeline.protocols import get_protocol
    from fedcxr.pipeline.run_driver import run_experiment

    data = tiny_config(tiny_manifests, tmp_path / "cache", defences=BLIND, **{**SGD, **overrides})
    plain_cfg = load_config(data=data)
    sealed_cfg = load_config(data={**data, "privacy": {"secure_aggregation": "he"}})
    run_experiment(plain_cfg, tmp_path / "plain", progress=False)
    uniform = get_protocol(sealed_cfg.method).default_backbone_weighting == "uniform"  # FL: 1/K
    transport = SealingTransport(site_transport(sealed_cfg, torch.device("cpu"), False), he_contexts, uniform)
    with contextlib.closing(transport):
        run_experiment(sealed_cfg, tmp_path / "sealed", progress=False, transport=transport)
    sealed_final = load_final_model(tmp_path / "sealed")
    return load_final_model(tmp_path / "plain"), sealed_final, open_final(sealed_final, he_contexts.client), transport


@pytest.mark.slow
@pytest.mark.parametrize("method, backbone", [("FedAvg_Finetune", "fedavg"), ("FedAvg", "fedbn"), ("FL", "fedavg")])
def test_a_protocol_run_on_sealed_replies_ends_where_the_plain_run_does(tiny_manifests, tmp_path, he_contexts,
                                                                        method, backbone):
    plain, sealed, opened, transport = _runs(tiny_manifests, tmp_path, he_contexts, strategy=method,
                                             backbone_aggregation=backbone,
                                             **({"target": None} if method != "FedAvg_Finetune" else {}))
    assert transport.seen and all(set(p) == {data_key(MODEL_BLOCK), layout_key(MODEL_BLOCK)} for p in transport.seen)
    clear = {k for k in sealed["global"] if not k.startswith("sealed.")}
    if backbone == "fedavg":
        assert clear == set()  # the server's final model: nothing in the clear
    else:
        assert clear == set(plain["eval_local_keys"])  # FedBN: the BatchNorm entries, θ0's (never averaged)
    assert transport.gaps and max(transport.gaps) < ROUND_TOLERANCE  # each round's sealed sum is FedAvg
    assert relative_gap(opened["global"], plain["global"]) < FINAL_TOLERANCE


def test_a_sealed_final_model_is_refused_by_evaluation_and_opened_by_a_key_holder(he_contexts, tmp_path, capsys):
    from fedcxr.cli import main
    from fedcxr.pipeline.checkpoints import load_final_model, save_final
    from fedcxr.pipeline.predictions import load_final
    from fedcxr.rundir import write_run_info

    state = _states(1)[0]
    run = tmp_path / "run"
    save_final(run, {"global": seal(state, he_contexts.client), "per_site": {},
                     "local_states": {"a": seal({"bn.weight": state["bn.weight"]}, he_contexts.client,
                                                block=LOCAL_BLOCK)}, "classes": ["edema"]})
    write_run_info(run, {"sites": ["a"], "eval_sites": ["a"]})
    with pytest.raises(Exception, match="is encrypted .*fedcxr flare decrypt"):
        load_final(run)
    assert main(["flare", "decrypt", str(run)]) == 2
    assert "needs --context FILE" in capsys.readouterr().err
    assert main(["flare", "decrypt", str(run), "--context", str(he_contexts.folder / "server_context.tenseal")]) == 2
    assert "holds no secret key" in capsys.readouterr().err
    assert main(["flare", "decrypt", str(run), "--context", str(he_contexts.folder / "client_context.tenseal")]) == 0
    final = load_final_model(run)
    assert max_diff(final["global"], state) < 1e-6
    assert torch.allclose(final["local_states"]["a"]["bn.weight"], state["bn.weight"], atol=1e-6)
    load_final(run)  # evaluation can read it now
    assert main(["flare", "decrypt", str(run), "--context", str(he_contexts.folder / "client_context.tenseal")]) == 0
    assert "holds no encrypted model" in capsys.readouterr().out


def test_a_rehearsal_keeps_its_keys_for_a_resume_and_only_for_its_owner(tmp_path):
    pytest.importorskip("tenseal", reason="TenSEAL (fedcxr[he]) cannot be imported on this platform")
    from fedcxr.flare.he_keys import CLIENT_CONTEXT, SERVER_CONTEXT, rehearsal_keys

    folder = rehearsal_keys(tmp_path / "he")
    first = (folder / CLIENT_CONTEXT).read_bytes()
    assert rehearsal_keys(tmp_path / "he") == folder and (folder / CLIENT_CONTEXT).read_bytes() == first
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert all(oct((folder / n).stat().st_mode & 0o777) == "0o600" for n in (CLIENT_CONTEXT, SERVER_CONTEXT))
    assert Path(folder / SERVER_CONTEXT).stat().st_size > 0


class Crash(RuntimeError):
    pass


@pytest.mark.slow
def test_a_sealed_run_resumes_from_its_encrypted_checkpoint(tiny_manifests, tmp_path, he_contexts):
    """A server that dies after round 0 continues from the encrypted checkpoint under the same keys and ends
    where the uninterrupted sealed run ends (CKKS draws fresh noise at every encryption: within ROUND_TOLERANCE
    of it, not bit for bit)."""
    from fedcxr.flare.secure_aggregation import open_final
    from fedcxr.pipeline.checkpoints import load_final_model
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.inprocess import site_transport
    from fedcxr.pipeline.run_driver import run_experiment

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", defences=BLIND, strategy="FedAvg",
                                       target=None, eval_every=0, privacy={"secure_aggregation": "he"}, **SGD))

    def sealed_run(run_dir, *, resume=False, crash_at=None):
        transport = SealingTransport(site_transport(cfg, torch.device("cpu"), False), he_contexts)
        inner_run = transport.run

        def run(task, targets, params, config, **kw):
            if crash_at is not None and task == "train" and getattr(config, "round", None) == crash_at:
                raise Crash("the server died")
            return inner_run(task, targets, params, config, **kw)

        transport.run = run
        with contextlib.closing(transport):
            run_experiment(cfg, run_dir, progress=False, transport=transport, resume=resume)

    sealed_run(tmp_path / "whole")
    with pytest.raises(Crash):
        sealed_run(tmp_path / "resumed", crash_at=1)
    assert (tmp_path / "resumed" / "checkpoints" / "round_0000.pt").is_file()
    assert not (tmp_path / "resumed" / "final_model.pt").exists()
    sealed_run(tmp_path / "resumed", resume=True)
    whole, resumed = (open_final(load_final_model(tmp_path / d), he_contexts.client) for d in ("whole", "resumed"))
    assert relative_gap(resumed["global"], whole["global"]) < 1e-5


def test_a_sites_own_sealed_model_opens_without_an_entry_twice(he_contexts):
    """Cross-site evaluation sends each site the global model with its own sealed local block. FedBN's local
    block (BatchNorm) sits beside the model block; a personalised method's (Ditto: the whole model) covers
    it, so the model block is left out — otherwise the site refuses an entry in two blocks."""
    from fedcxr.flare.secure_aggregation import own_sealed_model

    torch.manual_seed(0)
    model = {"conv.weight": torch.randn(4, 3), "bn.running_var": torch.rand(4) + 1}
    own = {k: v + 1 for k, v in model.items()}
    global_model = seal(model, he_contexts.client)
    whole = {**global_model, **seal(own, he_contexts.client, block=LOCAL_BLOCK)}
    with pytest.raises(SealError, match="in two sealed blocks"):
        open_sealed(whole, he_contexts.client)
    sent = own_sealed_model(whole)
    assert set(sent) == {data_key(LOCAL_BLOCK), layout_key(LOCAL_BLOCK)}
    assert max_diff(open_sealed(sent, he_contexts.client), own) < TOLERANCE
    fedbn = {**seal(model, he_contexts.client, exclude=["bn.running_var"]),
             **seal({"bn.running_var": own["bn.running_var"]}, he_contexts.client, block=LOCAL_BLOCK)}
    assert own_sealed_model(fedbn).keys() == fedbn.keys()  # the local block covers only part: both go
    opened = open_sealed(own_sealed_model(fedbn), he_contexts.client)
    assert max_diff(opened, {"conv.weight": model["conv.weight"], "bn.running_var": own["bn.running_var"]}) < TOLERANCE
    assert own_sealed_model(model) == model  # nothing sealed: as it is
