"""Sealed model states: how a site encrypts what it sends and opens what it receives (``privacy.secure_aggregation``).

With ``privacy.secure_aggregation: he`` every model a site sends leaves it encrypted with CKKS
(TenSEAL, the scheme NVIDIA FLARE's ``nvflare[HE]`` uses), under the key FLARE's provisioning
gives every client (``HEBuilder``: ``client_context.tenseal``); the server holds only the public
context (``server_context.tenseal``) and sums ciphertexts (:mod:`fedcxr.flare.secure_aggregation`).

A **sealed state** is an ordinary state dict — so checkpoints, copies, ``torch.load(weights_only=
True)`` and :mod:`fedcxr.flare.wire` carry it as any other — in which the entries the server must
not read are replaced by one *block*:

* ``sealed.<block>.data``: uint8, the block's CKKS ciphertexts (TenSEAL serialisations, one after
  the other);
* ``sealed.<block>.layout``: uint8, UTF-8 JSON ``{"format", "version", "slots", "entries":
  [[key, shape, dtype], ...], "chunks": [bytes of each ciphertext]}``.

Packing: the block's entries, sorted by name, flattened into one float64 vector, then one
**check slot** holding 1.0, cut into chunks of ``slots`` values (poly_modulus_degree / 2: 4096
with FLARE's default context), one ciphertext each. One packed vector instead of FLARE's one
ciphertext per layer: a 16-value BatchNorm vector would otherwise cost a whole ciphertext
(BENCHMARKS.md "Secure aggregation"). The check slot of a weighted mean is Σ w_i/Σw · 1 = 1, so
a site that opens a block made under another key (a re-provisioned system, a resumed rehearsal
with new keys) or by a wrong sum sees it at once (:class:`WrongKey`) instead of training on noise.

Entries a block does not hold stay in the clear beside it (FedBN's BatchNorm entries of the
global model: the server's own θ0 values, never averaged). Opening puts a block's entries over
plain entries of the same name: a site's own sealed local state over the global's.

Every integer entry (``num_batches_tracked``) travels as a real number and is rounded back on
opening (the plaintext FedAvg rounds its weighted mean too). Values must stay within what the
context holds after the server's one multiplication by a weight (:func:`value_bound`, ±2¹⁸ with
FLARE's default [60, 40, 40] bits at scale 2⁴⁰); a site refuses to seal a larger value, or NaN/Inf,
naming the entry.

Everything read here may come from a hostile party: layouts are bounded before they are parsed,
chunk counts and sizes checked against the layout before any ciphertext is decoded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import numpy as np
import torch

from fedcxr.pipeline.keys import SEALED_PREFIX
from fedcxr.pipeline.messages import StateDict

FORMAT = "fedcxr-sealed"
VERSION = 1
#: the block of a site's model reply and of the server's weighted mean
MODEL_BLOCK = "model"
#: the block of a site's own local entries (FedBN's BatchNorm statistics), sent once at the end
LOCAL_BLOCK = "local"
BLOCK_NAMES = (MODEL_BLOCK, LOCAL_BLOCK)
#: the value of the check slot after every packing and every weighted mean
CHECK_VALUE = 1.0
#: how far an opened check slot may be from 1 (CKKS noise is ~1e-7 here; another key gives ~1e19)
CHECK_TOLERANCE = 1e-3
MAX_LAYOUT_BYTES = 4 << 20
MAX_CHUNK_BYTES = 64 << 20
MAX_KEY_CHARS = 300
MAX_DIMS = 8
#: the dtypes a sealed entry may have (what fedcxr models hold)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
          "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64}


class SealError(ValueError):
    """A sealed block that cannot be made or used; the message says which entry or part and why."""


class WrongKey(SealError):
    """A block opened to a wrong check slot: sealed under another key, or not a weighted mean of sealed states."""


# --------------------------------------------------------------------------- names


def data_key(block: str) -> str:
    return f"{SEALED_PREFIX}{block}.data"


def layout_key(block: str) -> str:
    return f"{SEALED_PREFIX}{block}.layout"


def is_sealed(state: Optional[Mapping[str, Any]]) -> bool:
    """Whether ``state`` holds a sealed block (or a stray sealed entry)."""
    return bool(state) and any(str(k).startswith(SEALED_PREFIX) for k in state)


def block_names(state: Mapping[str, Any]) -> list[str]:
    """The blocks of ``state``; :class:`SealError` for a sealed entry that is not one of a block's two."""
    names = []
    for key in state:
        if not str(key).startswith(SEALED_PREFIX):
            continue
        rest = str(key)[len(SEALED_PREFIX):]
        block, _, part = rest.rpartition(".")
        if block not in BLOCK_NAMES or part not in ("data", "layout"):
            raise SealError(f"unexpected sealed entry {str(key)[:80]!r} (blocks: {', '.join(BLOCK_NAMES)})")
        if block not in names:
            names.append(block)
    for block in names:
        if data_key(block) not in state or layout_key(block) not in state:
            raise SealError(f"sealed block {block!r} lacks its data or its layout")
    return names


def plain_part(state: Mapping[str, torch.Tensor]) -> StateDict:
    """The entries of ``state`` in the clear."""
    return {k: v for k, v in state.items() if not str(k).startswith(SEALED_PREFIX)}


# --------------------------------------------------------------------------- context facts


def context_slots(context) -> int:
    """Values one ciphertext holds: half the polynomial modulus degree."""
    return int(context.seal_context().data.first_context_data().parms().poly_modulus_degree()) // 2


def value_bound(context) -> float:
    """Largest |value| a sealed entry may hold: after one multiplication by a weight and its rescale,
    ``value · scale`` must stay below half the modulus left (one bit of margin)."""
    data = context.seal_context().data.first_context_data()
    after = data.next_context_data()
    bits = (after or data).total_coeff_modulus_bit_count()
    return float(2.0 ** (bits - math.log2(context.global_scale) - 2))


def check_context(context, *, private: bool, what: str) -> None:
    """Refuse a context that cannot serve: without the secret key at a site, with it at the server,
    or unable to rescale once (the server's multiplication by a weight)."""
    if private and not context.is_private():
        raise SealError(f"{what} holds no secret key: a site needs client_context.tenseal from FLARE's "
                        "provisioning (HEBuilder)")
    if not private and context.is_private():
        raise SealError(f"{what} holds a secret key: the server must get server_context.tenseal only "
                        "(FLARE's HEBuilder writes the secret key into the clients' kits alone)")
    data = context.seal_context().data.first_context_data()
    if data.next_context_data() is None:
        raise SealError(f"{what} allows no rescaling (its coeff_mod_bit_sizes have no level to spare): the "
                        "server's weighted mean needs one; FLARE's default HEBuilder([60, 40, 40]) has it")


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """What a block holds: its entries (sorted by name), the values per ciphertext, each ciphertext's size."""

    entries: tuple[tuple[str, tuple[int, ...], str], ...]
    slots: int
    chunks: tuple[int, ...]

    @property
    def count(self) -> int:
        """Values of the entries (the check slot not counted)."""
        return sum(math.prod(shape) for _, shape, _ in self.entries)

    def n_chunks(self) -> int:
        return -(-(self.count + 1) // self.slots)

    def chunk_sizes(self) -> list[int]:
        """Values per ciphertext: full ones, then the rest (check slot included)."""
        total = self.count + 1
        return [min(self.slots, total - i * self.slots) for i in range(self.n_chunks())]

    def same_entries(self, other: "Layout") -> bool:
        return self.entries == other.entries and self.slots == other.slots

    def to_tensor(self) -> torch.Tensor:
        text = json.dumps({"format": FORMAT, "version": VERSION, "slots": self.slots,
                           "entries": [[k, list(s), d] for k, s, d in self.entries], "chunks": list(self.chunks)},
                          separators=(",", ":"))
        return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)

    @classmethod
    def from_tensor(cls, tensor: Any, where: str) -> "Layout":
        """The layout in ``tensor``; :class:`SealError` naming ``where`` for anything else (bounded first)."""
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
            raise SealError(f"{where}: a layout must be a 1-dimensional uint8 tensor")
        if tensor.numel() > MAX_LAYOUT_BYTES:
            raise SealError(f"{where}: layout of {tensor.numel()} bytes (at most {MAX_LAYOUT_BYTES})")
        try:
            data = json.loads(bytes(tensor.numpy().tobytes()).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise SealError(f"{where}: the layout is not UTF-8 JSON") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
            raise SealError(f"{where}: not a {FORMAT} layout of version {VERSION}")
        slots, entries, chunks = data.get("slots"), data.get("entries"), data.get("chunks")
        if not _count(slots) or slots < 1 or not isinstance(entries, list) or not isinstance(chunks, list):
            raise SealError(f"{where}: the layout needs slots, entries and chunks")
        layout = cls(entries=tuple(_entry(e, f"{where}: entry {i}") for i, e in enumerate(entries)), slots=slots,
                     chunks=tuple(chunks))
        keys = [k for k, _, _ in layout.entries]
        if keys != sorted(set(keys)):
            raise SealError(f"{where}: entries must be named once each, sorted by name")
        if len(chunks) != layout.n_chunks() or not all(_count(c) and 0 < c <= MAX_CHUNK_BYTES for c in chunks):
            raise SealError(f"{where}: {len(chunks)} ciphertext sizes for {layout.count} values at {slots} per "
                            f"ciphertext (expected {layout.n_chunks()}, each 1..{MAX_CHUNK_BYTES} bytes)")
        return layout


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(item: Any, where: str) -> tuple[str, tuple[int, ...], str]:
    if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], list)
            and isinstance(item[2], str)):
        raise SealError(f"{where}: expected [name, shape, dtype]")
    key, shape, dtype = item
    if not key or len(key) > MAX_KEY_CHARS or key.startswith(SEALED_PREFIX):
        raise SealError(f"{where}: bad entry name {key[:60]!r}")
    if len(shape) > MAX_DIMS or not all(_count(d) for d in shape):
        raise SealError(f"{where} ({key[:60]!r}): shape must be at most {MAX_DIMS} non-negative integers")
    if dtype not in DTYPES:
        raise SealError(f"{where} ({key[:60]!r}): dtype {dtype[:20]!r} is not one of {sorted(DTYPES)}")
    return key, tuple(shape), dtype


def entries_of(state: Mapping[str, torch.Tensor], exclude: Iterable[str] = ()) -> tuple:
    """The layout entries ``(name, shape, dtype)`` of ``state``'s entries but ``exclude``, sorted by name."""
    left_out = set(exclude)
    return tuple((k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in sorted(state.items())
                 if k not in left_out)


# --------------------------------------------------------------------------- a site seals ...


def seal(state: Mapping[str, torch.Tensor], context, *, block: str = MODEL_BLOCK,
         exclude: Iterable[str] = ()) -> StateDict:
    """``state`` (but ``exclude``: entries that stay at the site) as one sealed block; nothing in the clear.

    :class:`SealError` naming the entry for NaN/Inf, a value beyond :func:`value_bound`, a dtype
    that is not a number, or an entry that is sealed already.
    """
    import tenseal as ts

    if block not in BLOCK_NAMES:
        raise ValueError(f"unknown block {block!r}")
    entries = entries_of(state, exclude)
    for key, _, dtype in entries:
        if key.startswith(SEALED_PREFIX):
            raise SealError(f"entry {key!r} is sealed already")
        if dtype not in DTYPES:
            raise SealError(f"entry {key!r} has dtype {dtype}, which cannot be sealed")
    values = np.concatenate([state[k].detach().cpu().to(torch.float64).reshape(-1).numpy() for k, _, _ in entries]
                            + [np.array([CHECK_VALUE])])
    _check_values(values, entries, value_bound(context))
    slots = context_slots(context)
    data, sizes = bytearray(), []
    for i in range(0, len(values), slots):  # one ciphertext at a time into one buffer: memory ~ the result
        piece = ts.ckks_vector(context, values[i:i + slots]).serialize()
        sizes.append(len(piece))
        data += piece
    return block_entries(block, Layout(entries=entries, slots=slots, chunks=tuple(sizes)), data)


def block_entries(block: str, layout: Layout, data: bytearray) -> StateDict:
    """The two entries of a block: its ciphertexts' bytes (shared, not copied) and its layout."""
    return {data_key(block): torch.frombuffer(data, dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8),
            layout_key(block): layout.to_tensor()}


def _check_values(values: np.ndarray, entries: tuple, bound: float) -> None:
    bad = ~np.isfinite(values) | (np.abs(values) > bound)
    if not bad.any():
        return
    index = int(np.argmax(bad))
    start = 0
    for key, shape, _ in entries:
        size = math.prod(shape)
        if index < start + size:
            value = values[index]
            why = "is not finite" if not np.isfinite(value) else f"= {value:.4g} is beyond ±{bound:.4g}, what the HE " \
                  "context holds after the server's weighting (a larger scale or modulus in the provisioning)"
            raise SealError(f"entry {key!r} {why}; the update is not sent")
        start += size


# --------------------------------------------------------------------------- ... and opens


def open_sealed(state: Mapping[str, torch.Tensor], context) -> StateDict:
    """``state`` with every sealed block decrypted back into its entries (plain entries kept; a block's
    entries replace plain ones of the same name). :class:`WrongKey` when a block's check slot is off."""
    names = block_names(state)
    out = dict(plain_part(state))
    seen: set[str] = set()
    for block in names:
        entries = open_block(state, block, context)
        again = seen.intersection(entries)
        if again:
            raise SealError(f"entries {sorted(again)[:3]} are in two sealed blocks")
        seen.update(entries)
        out.update(entries)
    return out


def open_block(state: Mapping[str, torch.Tensor], block: str, context) -> StateDict:
    """One block's entries, decrypted, reshaped and cast back (integers rounded)."""
    layout, pieces = parse_block(state, block)
    values = np.empty(layout.count + 1, dtype=np.float64)
    start = 0
    for piece, size in zip(pieces, layout.chunk_sizes()):
        vector = load_vector(context, piece, block)
        if vector.size() != size:
            raise SealError(f"sealed block {block!r}: a ciphertext holds {vector.size()} values, the layout says {size}")
        try:
            values[start:start + size] = vector.decrypt()
        except ValueError as exc:  # TenSEAL: a public context "doesn't hold a secret_key"
            raise SealError(f"sealed block {block!r} cannot be opened with this HE context ({str(exc)[:80]})") from None
        start += size
    check = float(values[-1])
    if not abs(check - CHECK_VALUE) <= CHECK_TOLERANCE:
        raise WrongKey(f"sealed block {block!r} opens to a check value of {check:.4g} instead of {CHECK_VALUE}: it was "
                       "encrypted under another key than this site's (a different provisioning, or a resumed run "
                       "whose keys changed) or is not a weighted mean of sealed models")
    out, start = {}, 0
    for key, shape, dtype in layout.entries:
        size = math.prod(shape)
        chunk = torch.from_numpy(values[start:start + size].copy()).reshape(shape)
        kind = DTYPES[dtype]
        out[key] = chunk.to(kind) if kind.is_floating_point else chunk.round().to(kind)
        start += size
    return out


def parse_block(state: Mapping[str, torch.Tensor], block: str) -> tuple[Layout, list[memoryview]]:
    """A block's layout and views of its ciphertexts' bytes (no copy), sizes checked against the layout
    (nothing decoded)."""
    where = f"sealed block {block!r}"
    layout = Layout.from_tensor(state.get(layout_key(block)), where)
    data = state.get(data_key(block))
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
        raise SealError(f"{where}: its data must be a 1-dimensional uint8 tensor")
    if data.numel() != sum(layout.chunks):
        raise SealError(f"{where}: {data.numel()} bytes of ciphertext, the layout says {sum(layout.chunks)}")
    raw = memoryview(data.contiguous().numpy()).cast("B")
    pieces, start = [], 0
    for size in layout.chunks:
        pieces.append(raw[start:start + size])
        start += size
    return layout, pieces


def load_vector(context, piece: bytes | memoryview, block: str):
    """One ciphertext of ``block`` loaded under ``context`` (:class:`SealError` when it does not load)."""
    import tenseal as ts

    try:
        return ts.ckks_vector_from(context, bytes(piece))
    except Exception as exc:  # TenSEAL: ValueError("failed to parse CKKS stream") and kin
        raise SealError(f"sealed block {block!r}: a ciphertext does not load under this HE context "
                        f"({type(exc).__name__}: {str(exc)[:80]})") from None


__all__ = ["BLOCK_NAMES", "CHECK_TOLERANCE", "LOCAL_BLOCK", "Layout", "MODEL_BLOCK", "SealError", "WrongKey",
           "block_names", "check_context", "context_slots", "data_key", "block_entries", "entries_of", "is_sealed", "layout_key",
           "load_vector", "open_block", "open_sealed", "parse_block", "plain_part", "seal", "value_bound"]
