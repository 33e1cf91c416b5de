"""Sealed model states (privacy.secure_aggregation): what a site sends, and why a block is refused."""

from __future__ import annotations

import json

import pytest
import torch

from fedcxr.flare.sealing import (
    CHECK_TOLERANCE,
    LOCAL_BLOCK,
    MODEL_BLOCK,
    Layout,
    SealError,
    WrongKey,
    data_key,
    is_sealed,
    layout_key,
    open_sealed,
    plain_part,
    seal,
    value_bound,
)


def _model() -> dict:
    torch.manual_seed(0)
    return {"conv.weight": torch.randn(16, 1, 3, 3), "bn.running_var": torch.rand(16) + 0.5,
            "bn.num_batches_tracked": torch.tensor(123), "head.weight": torch.randn(3, 4000),
            "head.bias": torch.randn(3).double()}


def test_a_sealed_model_opens_to_the_same_entries_shapes_and_dtypes(he_contexts):
    state = _model()
    sealed = seal(state, he_contexts.client)
    assert set(sealed) == {data_key(MODEL_BLOCK), layout_key(MODEL_BLOCK)} and not plain_part(sealed)
    opened = open_sealed(sealed, he_contexts.client)
    assert opened.keys() == state.keys()
    for key, value in state.items():
        assert opened[key].dtype == value.dtype and opened[key].shape == value.shape
        assert float((opened[key].double() - value.double()).abs().max()) < 1e-6
    assert int(opened["bn.num_batches_tracked"]) == 123


def test_the_ciphertext_does_not_hold_the_weights_bytes(he_contexts):
    state = _model()
    raw = bytes(seal(state, he_contexts.client)[data_key(MODEL_BLOCK)].numpy().tobytes())
    for key in ("conv.weight", "head.weight"):
        assert state[key].numpy().tobytes()[:16] not in raw


def test_the_servers_context_cannot_open_a_block_and_another_key_is_caught_by_the_check_slot(he_contexts, tmp_path):
    from fedcxr.flare.he_keys import CLIENT_CONTEXT, read_context_file, rehearsal_keys

    sealed = seal(_model(), he_contexts.client)
    with pytest.raises(SealError, match="cannot be opened with this HE context"):
        open_sealed(sealed, he_contexts.server)
    other = read_context_file(rehearsal_keys(tmp_path / "other") / CLIENT_CONTEXT, private=True)
    with pytest.raises(WrongKey, match="check value .* instead of 1.0: it was encrypted under another key"):
        open_sealed(sealed, other)


def test_local_entries_never_leave_the_site(he_contexts):
    state = _model()
    sealed = seal(state, he_contexts.client, exclude=["bn.running_var", "bn.num_batches_tracked"])
    assert set(open_sealed(sealed, he_contexts.client)) == {"conv.weight", "head.weight", "head.bias"}


@pytest.mark.parametrize("bad, match", [(float("nan"), "is not finite"), (1e9, "= 1e\\+09 is beyond")])
def test_a_site_refuses_to_seal_what_the_context_cannot_hold_naming_the_entry(he_contexts, bad, match):
    state = _model()
    state["head.bias"][1] = bad
    with pytest.raises(SealError, match=f"entry 'head.bias' {match}"):
        seal(state, he_contexts.client)
    assert value_bound(he_contexts.client) == 2.0 ** 18  # FLARE's default context: 60 bits left, scale 2^40


def test_plain_entries_stay_beside_a_block_and_a_sites_local_block_goes_over_them(he_contexts):
    state = _model()
    global_model = {"bn.running_var": torch.ones(16), **seal(state, he_contexts.client, exclude=["bn.running_var"])}
    assert is_sealed(global_model) and set(plain_part(global_model)) == {"bn.running_var"}
    opened = open_sealed(global_model, he_contexts.client)
    assert torch.equal(opened["bn.running_var"], torch.ones(16))
    local = seal({"bn.running_var": state["bn.running_var"]}, he_contexts.client, block=LOCAL_BLOCK)
    merged = open_sealed({**global_model, **local}, he_contexts.client)
    assert torch.allclose(merged["bn.running_var"], state["bn.running_var"], atol=1e-6)
    twice = seal({"head.bias": state["head.bias"]}, he_contexts.client, block=LOCAL_BLOCK)
    with pytest.raises(SealError, match="in two sealed blocks"):
        open_sealed({**global_model, **twice}, he_contexts.client)


def _layout(sealed: dict) -> dict:
    return json.loads(bytes(sealed[layout_key(MODEL_BLOCK)].numpy().tobytes()))


def _with_layout(sealed: dict, data: dict) -> dict:
    text = json.dumps(data).encode()
    return {**sealed, layout_key(MODEL_BLOCK): torch.frombuffer(bytearray(text), dtype=torch.uint8)}


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(chunks=d["chunks"][:-1]), "ciphertext sizes for"),
    (lambda d: d.update(entries=d["entries"][::-1]), "sorted by name"),
    (lambda d: d["entries"][0].__setitem__(2, "object"), "dtype 'object' is not one of"),
    (lambda d: d["entries"][0].__setitem__(1, [-1]), "shape must be"),
    (lambda d: d.update(format="other"), "not a fedcxr-sealed layout"),
    (lambda d: d.update(chunks=[10 ** 12] * len(d["chunks"])), "each 1..67108864 bytes"),
])
def test_a_tampered_layout_is_refused_before_any_ciphertext_is_read(he_contexts, change, match):
    sealed = seal(_model(), he_contexts.client)
    data = _layout(sealed)
    change(data)
    with pytest.raises(SealError, match=match):
        open_sealed(_with_layout(sealed, data), he_contexts.client)


def test_damaged_data_and_stray_entries_are_refused(he_contexts):
    sealed = seal(_model(), he_contexts.client)
    cut = {**sealed, data_key(MODEL_BLOCK): sealed[data_key(MODEL_BLOCK)][:-5]}
    with pytest.raises(SealError, match="bytes of ciphertext, the layout says"):
        open_sealed(cut, he_contexts.client)
    noise = {**sealed, data_key(MODEL_BLOCK): torch.zeros_like(sealed[data_key(MODEL_BLOCK)])}
    with pytest.raises(SealError, match="does not load under this HE context"):
        open_sealed(noise, he_contexts.client)
    with pytest.raises(SealError, match="unexpected sealed entry"):
        open_sealed({**sealed, "sealed.other.data": torch.zeros(3, dtype=torch.uint8)}, he_contexts.client)
    with pytest.raises(SealError, match="lacks its data or its layout"):
        open_sealed({layout_key(MODEL_BLOCK): sealed[layout_key(MODEL_BLOCK)]}, he_contexts.client)
    with pytest.raises(SealError, match="layout of .* bytes"):
        Layout.from_tensor(torch.zeros(5 << 20, dtype=torch.uint8), "test")


def test_the_check_tolerance_is_far_above_ckks_noise_and_far_below_a_wrong_key():
    assert 1e-6 < CHECK_TOLERANCE < 1.0
