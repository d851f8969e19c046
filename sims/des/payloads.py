"""The pushes of the trainer stand-ins: seeded sparse payloads, and a hash to compare aggregates by.

A payload is a pure function of ``(seed, site index, iteration, layer)`` (one NumPy generator per push,
seeded with that tuple; a second, site-independent one for ``same_blocks``), not of the order in which
pushes are drawn. So the simulator and a cluster of
real daemons fed by real trainers (``tools/bench_sim.py``) push bit-identical payloads whatever their
timing, and their aggregates can be compared byte for byte.
"""

from __future__ import annotations

import hashlib

import numpy as np

from wanrt.payload import SparsePayload, n_blocks

__all__ = ["make_payload", "payload_digest"]


def make_payload(
    seed: int,
    site_index: int,
    iteration: int,
    layer: int,
    *,
    dense_len: int,
    density: float,
    block_size: int = 16,
    same_blocks: bool = False,
) -> SparsePayload:
    """``density`` of the layer's blocks (at least one), standard-normal fp32 values.

    ``same_blocks``: every site picks the same blocks in an iteration (an aggregate is then as small as
    one push); otherwise each site picks its own (the aggregate is their union, as with top-k of
    different gradients). The padded tail block of a layer whose length is not a multiple of the block
    size is never picked, so every payload is valid as is.
    """
    nb = n_blocks(dense_len, block_size)
    usable = nb - 1 if dense_len % block_size else nb
    usable = max(usable, 1)
    k = max(1, min(usable, round(density * nb)))
    # one generator per push when each site picks its own blocks (its values follow from the same
    # stream); a second, site-independent one only for the shared picks of same_blocks
    own = _rng(seed, site_index + 1, iteration, layer, 1)
    pick = _rng(seed, 0, iteration, layer) if same_blocks else own
    # shuffle=False: the same chosen set (it is sorted anyway), without the shuffle's extra draws
    if k < usable:
        idx = np.sort(pick.choice(usable, size=k, replace=False, shuffle=False))
    else:
        idx = np.arange(usable)
    vals = own.standard_normal(k * block_size)
    values = vals.astype(np.float32)
    if dense_len % block_size and usable == nb:  # a one-block layer shorter than a block: zero the padding
        values.reshape(-1, block_size)[:, dense_len % block_size :] = 0.0
    return SparsePayload(layer, dense_len, block_size, idx.astype(np.int64), values)


def _rng(*entropy: int) -> np.random.Generator:
    """``np.random.default_rng(list(entropy))``, bit for bit: entropy words below 2**32 handed over as a
    uint32 array skip NumPy's per-item coercion of a list, a third of seeding (seeding was ~10 % of a
    simulated 1 000-site round with two generators per push; one is enough unless blocks are shared)."""
    if all(0 <= e < 1 << 32 for e in entropy):
        words = np.array(entropy, dtype=np.uint32)
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
    return np.random.default_rng(list(entropy))


#: The last read-only payload digested and its digest: a result decoded once is delivered to every site of
#: the job (wanrt.protocol shares equal decoded payloads, read-only), so its digest is computed once.
_last: tuple[SparsePayload, str] | None = None


def payload_digest(p: SparsePayload) -> str:
    """16 hex digits over shape, dtype, indices and values: equal digests mean bit-identical payloads."""
    global _last
    if _last is not None and _last[0] is p:
        return _last[1]
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{p.layer}/{p.dense_len}/{p.block_size}/{p.value_dtype}/".encode())
    h.update(np.ascontiguousarray(p.indices, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(p.values).tobytes())
    digest = h.hexdigest()
    if not (p.values.flags.writeable or p.indices.flags.writeable):  # immutable: safe to remember
        _last = (p, digest)
    return digest
