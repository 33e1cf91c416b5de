"""Leaf: the names a server and its sites derive alike, without importing each other.

Why a module of its own: the run driver (:mod:`fedcxr.pipeline.run_driver`), the round
protocols, the site runner and the FLARE client all need the same seeds and the same
local-state key prefixes. Kept in the site runner, they made the protocols and the driver
import the site side; here they sit below all of them (no fedcxr import).

* :func:`derive_seed`: a stable seed from a base seed and labels (round, site, task), so a
  resumed or distributed run draws what an uninterrupted in-process one draws;
* ``*_PREFIX``: the prefixes of a site's local-state entries that are not model entries
  (optimiser state, SCAFFOLD's control variate, the warmed-up head, a method's own kept state);
  ``PRIVATE_PREFIXES`` never leave the site and evaluation ignores them;
* :data:`SEALED_PREFIX`: the entries of a model sealed by ``privacy.secure_aggregation``
  (:mod:`fedcxr.flare.sealing`): ciphertexts the server keeps and sums but cannot read.
"""

from __future__ import annotations

import hashlib

#: Local-state entries holding optimiser state kept across rounds: ``optimizer.<param>.<field>``.
OPTIMIZER_PREFIX = "optimizer."
#: Local-state entries of the head kept by the surgical head warm-up until round 0 uses it.
WARM_PREFIX = "warm."
#: Local-state entries of SCAFFOLD's site control variate c_i: ``control.<parameter name>``.
CONTROL_PREFIX = "control."
#: Local-state entries a method keeps at the site for itself: ``method.<method's key>.<entry>`` (docs/methods.md;
#: e.g. FedDyn's ∇L_k(θ_k^{t−1}) in ``examples/methods/feddyn.py``, a personalised method's local model).
METHOD_PREFIX = "method."
#: Local-state entries that never leave the site and are not model entries (evaluation ignores them).
PRIVATE_PREFIXES = (OPTIMIZER_PREFIX, CONTROL_PREFIX, METHOD_PREFIX)
#: Model entries sealed by ``privacy.secure_aggregation``: ``sealed.<block>.data`` / ``sealed.<block>.layout``.
SEALED_PREFIX = "sealed."


def derive_seed(base: int, *parts: object) -> int:
    """A stable 31-bit seed from a base seed and labels (round, site, task)."""
    text = ":".join([str(base), *map(str, parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


__all__ = ["CONTROL_PREFIX", "METHOD_PREFIX", "OPTIMIZER_PREFIX", "PRIVATE_PREFIXES", "SEALED_PREFIX", "WARM_PREFIX",
           "derive_seed"]
