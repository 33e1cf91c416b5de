"""Secure aggregation on FLARE (``privacy.secure_aggregation: he``): the server sums what it cannot read.

Where the methods allow it — the server needs only a weighted sum of the sites' models (the
FedAvg round and the methods built on it, FedBN's shared entries; a protocol says so with
:attr:`~fedcxr.pipeline.protocols.RoundProtocol.reads_each_update`) — every model a site sends
leaves it sealed under the clients' CKKS key (:mod:`fedcxr.flare.sealing`) and the server computes
FedAvg on the ciphertexts:

    Enc(θ) = Σ_i (w_i / Σ_j w_j) · Enc(θ_i)          w_i: the site's screened sample count (or 1)

one multiplication of each ciphertext by a plain number, then additions
(:meth:`SealedAggregation.weighted_mean`). The weights are the server's, from the counts it
checked (``defences.check_counts``), not a factor the site applied itself. The server keeps the
result sealed: it sends it to the sites, which open it with their key, checkpoints it, and writes it
sealed into ``final_model.pt``; a key holder opens that file afterwards (:func:`decrypt_run`,
``fedcxr flare decrypt``; ``fedcxr flare simulate|poc`` do it with the rehearsal's key).

What FLARE offers and why it is not used whole: NVIDIA FLARE's ``HEModelEncryptor`` /
``HEModelDecryptor`` filters encrypt each state-dict entry into its own ciphertexts and its FOBS
decomposer ships the public context (~660 KB of relinearisation keys) with every one — 14×
the bytes of one packed vector for ``resnet_tiny`` (BENCHMARKS.md "Secure aggregation") — and
a site whose app lacks the filter would send its update in the clear with nothing to stop it.
Here the fedcxr client seals by construction and refuses to answer otherwise. FLARE's
``HEInTimeAccumulateWeightedAggregator`` multiplies by the weight and then by 1/Σw: two
multiplications, which FLARE's default context ([60, 40, 40] bits) cannot do (TenSEAL: "scale
out of bounds") — FLARE therefore lets each site weigh itself. What is FLARE's is kept: the
contexts from its provisioning (``HEBuilder``), loaded by its security content service
(:mod:`fedcxr.flare.he_keys`), and TenSEAL's CKKS — no cryptography of fedcxr's own.

What the server can still check of a sealed reply (:meth:`SealedAggregation.structure_problem`):
its counts, that it holds exactly one sealed block and nothing in the clear, that the block's
entries, shapes and dtypes are the model's, and that every ciphertext has the size and loads
under the provisioned context. The value checks (``defences.norm_factor``, ``norm_limit``,
``bn_factor``, ``check_variance``) read an update and cannot run: the config must turn them off
(:class:`~fedcxr.pipeline.config.ExperimentConfig`). SECURITY.md states the promise and its limits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Optional

import torch

from fedcxr.flare.sealing import (
    LOCAL_BLOCK,
    MODEL_BLOCK,
    Layout,
    SealError,
    block_entries,
    block_names,
    check_context,
    context_slots,
    data_key,
    entries_of,
    is_sealed,
    layout_key,
    load_vector,
    open_sealed,
    parse_block,
    plain_part,
)
from fedcxr.pipeline.messages import StateDict

#: the one mode of ``privacy.secure_aggregation``
HE = "he"


class SealedAggregation:
    """The server's side of secure aggregation: checks of sealed replies and FedAvg on ciphertexts.

    ``context``: the server's public TenSEAL context (:func:`fedcxr.flare.he_keys.server_context`).
    The transport that carries sealed replies exposes it as ``Transport.sealed``; the protocols'
    reply checks and backbone average call it there (:mod:`fedcxr.pipeline.protocols.base`).
    """

    def __init__(self, context):
        check_context(context, private=False, what="the server's HE context")
        self.context = context
        self.slots = context_slots(context)

    # ------------------------------------------------------------------ checks
    def expected_entries(self, reference: Mapping[str, torch.Tensor], local: Iterable[str] = ()) -> tuple:
        """The entries a site's sealed model must hold: the reference's (plain or sealed) but ``local``."""
        plain = entries_of(plain_part(reference), local)
        sealed: list = []
        for block in block_names(reference):
            layout = Layout.from_tensor(reference[layout_key(block)], f"sealed block {block!r} sent")
            sealed += [e for e in layout.entries if e[0] not in set(local)]
        return tuple(sorted(plain + tuple(sealed)))

    def structure_problem(self, params: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor],
                          local: Iterable[str] = ()) -> Optional[str]:
        """Why a sealed reply must not be summed, or None: a block of the model's entries but ``local``
        (the site's own, FedBN), nothing in the clear, every ciphertext of its size and loading."""
        try:
            clear = sorted(plain_part(params))
            if clear:
                return f"entries {clear[:3]} came in the clear in a sealed reply"
            if block_names(params) != [MODEL_BLOCK]:
                return f"a sealed reply must hold one block {MODEL_BLOCK!r}, not {block_names(params)}"
            layout, pieces = parse_block(params, MODEL_BLOCK)
            if layout.slots != self.slots:
                return f"sealed with {layout.slots} values per ciphertext; this system's context holds {self.slots}"
            expected = self.expected_entries(reference, local)
            if layout.entries != expected:
                return _difference(layout.entries, expected)
            for piece, size in zip(pieces, layout.chunk_sizes()):
                if load_vector(self.context, piece, MODEL_BLOCK).size() != size:
                    return "a ciphertext holds another number of values than its layout says"
        except SealError as exc:
            return str(exc)
        return None

    # ------------------------------------------------------------------ FedAvg on ciphertexts
    def weighted_mean(self, theta0: Mapping[str, torch.Tensor], states: Mapping[str, Mapping[str, torch.Tensor]],
                      weights: list[float]) -> StateDict:
        """``Σ_i (w_i/Σw)·Enc(θ_i)`` of the screened sealed states (site → state, ``weights`` in that order),
        with θ0's plain entries the states do not hold (FedBN's BatchNorm). Same arithmetic as
        :func:`fedcxr.pipeline.aggregate.fedavg`, on ciphertexts, and as pure (the inputs are never
        changed, the context only read); :class:`SealError` naming a site whose ciphertexts cannot be
        added to the others' (other CKKS parameters)."""
        sites = list(states)
        if not sites or len(weights) != len(sites):
            raise ValueError(f"weighted_mean: {len(sites)} states, {len(weights)} weights")
        total = float(sum(weights))
        if not total > 0:
            raise ValueError("weighted_mean: all weights are zero")
        parsed = {s: parse_block(states[s], MODEL_BLOCK) for s in sites}
        layout = parsed[sites[0]][0]
        for site in sites[1:]:
            if not parsed[site][0].same_entries(layout):
                raise SealError(f"the sealed models of {sites[0]} and {site} hold different entries")
        data, sizes = bytearray(), []
        for j in range(layout.n_chunks()):  # chunk by chunk: memory ~ the replies and the mean, no copies
            acc = None
            for site, weight in zip(sites, weights):
                term = load_vector(self.context, parsed[site][1][j], MODEL_BLOCK) * (float(weight) / total)
                try:
                    acc = term if acc is None else acc + term
                except ValueError as exc:  # TenSEAL: "scale mismatch" and kin
                    raise SealError(f"the ciphertexts of {site} cannot be added to {', '.join(sites[:sites.index(site)])}'s "
                                    f"({str(exc)[:60]}): a site encrypts with other CKKS parameters than provisioned")
            piece = acc.serialize()
            sizes.append(len(piece))
            data += piece
        return self._with_block(theta0, Layout(layout.entries, layout.slots, tuple(sizes)), data)

    @staticmethod
    def _with_block(theta0: Mapping[str, torch.Tensor], layout: Layout, data: bytearray) -> StateDict:
        """θ0's plain entries the new block does not hold, and the block (θ0's old one replaced)."""
        covered = {key for key, _, _ in layout.entries}
        for block in block_names(theta0):
            old = Layout.from_tensor(theta0[layout_key(block)], f"sealed block {block!r}")
            left = sorted({key for key, _, _ in old.entries} - covered)
            if left:  # the protocols refuse the combinations that would need this (secure_aggregation_problem)
                raise SealError(f"the new sealed model does not hold {left[:3]} of the previous one, which the "
                                "server cannot take out of a ciphertext")
        out = {k: v for k, v in plain_part(theta0).items() if k not in covered}
        out.update(block_entries(MODEL_BLOCK, layout, data))
        return out


def _difference(got: tuple, expected: tuple) -> str:
    have, want = {e[0]: e for e in got}, {e[0]: e for e in expected}
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        parts = ([f"missing {missing[:3]}"] if missing else []) + ([f"unexpected {extra[:3]}"] if extra else [])
        return "the sealed model's entries differ from the model's: " + "; ".join(parts)
    key = next(k for k in want if have[k] != want[k])
    return (f"sealed entry {key!r} has shape {list(have[key][1])} {have[key][2]}, the model's "
            f"{list(want[key][1])} {want[key][2]}")


# --------------------------------------------------------------------------- the final model, opened by a key holder


def final_is_sealed(final: Mapping) -> bool:
    """Whether a ``final_model.pt`` payload holds a sealed model (global, a site's own, or a local state)."""
    parts = [final.get("global")] + list((final.get("per_site") or {}).values()) + \
        list((final.get("local_states") or {}).values())
    return any(isinstance(p, Mapping) and is_sealed(p) for p in parts)


def open_final(final: Mapping, context) -> dict:
    """The ``final_model.pt`` payload with every sealed part opened (the rest unchanged)."""
    out = dict(final)
    out["global"] = open_sealed(final["global"], context)
    out["per_site"] = {s: open_sealed(v, context) for s, v in (final.get("per_site") or {}).items()}
    out["local_states"] = {s: open_sealed(v, context) for s, v in (final.get("local_states") or {}).items()}
    return out


def decrypt_run(run_dir: Path, context) -> bool:
    """Replace a run's sealed ``final_model.pt`` with the opened one (checksum rewritten); False when it
    holds no sealed model (decrypted before, or a plain run). Checkpoints stay sealed: a resume
    continues from them under the same keys."""
    from fedcxr.pipeline.checkpoints import load_final_model, save_final

    final = load_final_model(run_dir)
    if not final_is_sealed(final):
        return False
    save_final(run_dir, open_final(final, context))
    return True


def own_sealed_model(params: Mapping[str, torch.Tensor]) -> dict:
    """A site's own model as the server sends it for evaluation: the global model with the site's sealed
    local block beside it. When that local block holds every entry of the global's model block (a
    personalised method whose site keeps its whole model, its protocol's ``eval_local_keys``), the model block adds
    nothing and is left out, so the site opens no entry twice (:func:`~fedcxr.flare.sealing.open_sealed`
    refuses an entry in two blocks). Only the blocks' layouts are read, never a ciphertext."""
    names = block_names(params)
    if MODEL_BLOCK not in names or LOCAL_BLOCK not in names:
        return dict(params)
    model = {key for key, _, _ in parse_block(params, MODEL_BLOCK)[0].entries}
    local = {key for key, _, _ in parse_block(params, LOCAL_BLOCK)[0].entries}
    if not model <= local:
        return dict(params)
    return {k: v for k, v in params.items() if k not in (data_key(MODEL_BLOCK), layout_key(MODEL_BLOCK))}


def local_block_of(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``state`` is a site's sealed local state (one block ``local``, nothing in the clear)."""
    return not plain_part(state) and block_names(state) == [LOCAL_BLOCK]


__all__ = ["HE", "SealedAggregation", "decrypt_run", "final_is_sealed", "local_block_of", "open_final",
           "own_sealed_model"]
