"""The gateway's bounded-forwarding policy, applied where a round's sums are made.

StellaTrain §6 bounds an update by letting each of the N sites contribute its top k/N blocks
(``forward_policy = "per_site"``, applied to this site's own contribution and to a carry sent ahead), or
an aggregate may be re-sparsified to its top ``density`` share (``"cap"``, applied to a final or to a ring
or all-pairs segment of it). What is not forwarded is returned as a remainder, which the engine keeps in the
layer's carry (the gateway's error feedback): nothing is lost. The split itself is
:func:`gateways.rounds.aggregate.top_blocks`; this class only says which policy applies where. With
``result_coding = "wire"`` a capped result is then re-coded in its layer's low-bit coding, the coding's error
joining the remainder (:mod:`gateways.rounds.result_coding`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gateways.rounds.aggregate import aggregate_cap, per_site_cap, top_blocks
from gateways.rounds.config import RoundConfig
from gateways.rounds.result_coding import Coding, requantise
from wanrt.payload import SparsePayload

__all__ = ["ForwardBound"]

Split = tuple[SparsePayload | None, SparsePayload | None]


class ForwardBound:
    """``config.forward_policy`` with ``config.forward_density``; ``"exact"`` forwards everything."""

    def __init__(self, config: RoundConfig, coding: Callable[[int], Coding | None] | None = None) -> None:
        self.policy = config.forward_policy
        self.density = config.forward_density
        # a layer's low-bit coding (None: not low-bit, or not known yet), when results are re-coded
        self._coding = coding if config.result_coding == "wire" else None

    def cap_own(self, p: SparsePayload | None, members: int) -> Split:
        """A site's own contribution (or carry) among ``members`` sites: ``(kept, remainder or None)``."""
        if p is None or self.policy != "per_site":
            return p, None
        kept, rest = top_blocks(p, per_site_cap(p.dense_len, p.block_size, self.density, members))
        return kept, (rest if rest.nnz_blocks else None)

    def bound(self, p: SparsePayload | None, scope_blocks: int | None) -> Split:
        """Apply the ``cap`` policy to a final (or a ring segment of ``scope_blocks`` blocks)."""
        if p is None or self.policy != "cap":
            return p, None
        if scope_blocks is None:
            cap = aggregate_cap(p.dense_len, p.block_size, self.density)
        else:
            cap = max(1, math.ceil(self.density * scope_blocks))
        kept, rest = top_blocks(p, cap)
        left = rest if rest.nnz_blocks else None
        coding = None if self._coding is None else self._coding(p.layer)
        return (kept, left) if coding is None else requantise(kept, left, coding)
