"""Checks on what a peer gateway sends the round engine, done before anything is stored or allocated.

Kept apart from the engine so the rules a peer must follow read in one place. Everything here raises a
:class:`~wanrt.errors.RemoteProtocolError` subclass naming the peer: the daemon closes that peer's connection
and keeps serving the others; nothing a peer sends can crash the engine or make it keep unbounded state.
"""

from __future__ import annotations

from gateways.rounds.aggregate import segment_bounds
from gateways.rounds.allpairs import piece_bounds
from gateways.rounds.config import MAX_LAYERS
from gateways.rounds.topology import Plan
from wanrt.errors import LimitExceeded, MalformedPayload, RemoteProtocolError
from wanrt.payload import SparsePayload, n_blocks
from wanrt.protocol.peer.contrib_ids import ContribIds
from wanrt.protocol.peer.round_msg import MSG_KINDS, ContribId, RoundMsg

__all__ = ["check_allpairs_message", "check_message", "check_ring_message"]


def check_message(
    peer: str,
    m: RoundMsg,
    *,
    site: str,
    sites: frozenset[str],
    lowest: int,
    highest: int,
    max_ids: int,
) -> None:
    """Field types, the iteration window ``[lowest, highest]``, the layer bound, and the contribution ids
    (known sites, not from the future, strictly increasing so a set is canonical and duplicate-free).

    ``sites`` should be interned (:func:`wanrt.protocol.peer.contrib_ids.intern_sites`): a
    :class:`ContribIds` remembers
    the set it passed against, so the same result reaching many gateways is walked once."""
    if type(m) is not RoundMsg or m.kind not in MSG_KINDS:
        raise RemoteProtocolError("not a round message", peer=peer, value=getattr(m, "kind", None))
    for name in ("iteration", "layer", "plan_id", "step", "segment"):
        if type(getattr(m, name)) is not int:
            raise RemoteProtocolError(f"{name} must be an integer", peer=peer, value=getattr(m, name))
    if m.payload is not None and not isinstance(m.payload, SparsePayload):
        raise RemoteProtocolError("payload must be a SparsePayload", peer=peer)
    if not isinstance(m.sites, tuple):
        raise RemoteProtocolError("sites must be a tuple", peer=peer)
    if not 0 <= m.layer < MAX_LAYERS:
        raise LimitExceeded(
            "layer id out of range", name="MAX_LAYERS", limit=MAX_LAYERS, value=m.layer, peer=peer
        )
    if m.iteration > highest:
        raise LimitExceeded(
            "iteration too far ahead", name="window", limit=highest, value=m.iteration, peer=peer
        )
    if m.iteration < max(0, lowest):
        raise RemoteProtocolError("iteration settled long ago", peer=peer, value=m.iteration, limit=lowest)
    if len(m.sites) > max_ids:
        raise LimitExceeded(
            "too many contribution ids", name="sites", limit=max_ids, value=len(m.sites), peer=peer
        )
    top = m.iteration
    ids = m.sites
    if type(ids) is ContribIds and ids.checked_against(sites):
        # the same immutable id set already passed the loop below for this very (interned) site set: only
        # the bound that depends on this message is left (a result reaches every gateway of the job)
        if ids.top() > top:
            raise RemoteProtocolError("contribution id from the future", peer=peer, value=ids.top())
    else:
        prev: ContribId | None = None
        for cid in ids:
            if type(cid) is not tuple or len(cid) != 2:
                raise RemoteProtocolError("invalid contribution id", peer=peer, value=cid)
            s, it = cid
            if (
                s not in sites
                or type(it) is not int
                or not 0 <= it <= top
                or (prev is not None and cid <= prev)
            ):
                raise RemoteProtocolError("invalid contribution id", peer=peer, value=cid)
            prev = cid
        if type(ids) is ContribIds:
            ids.mark_checked(sites)
    if m.payload is not None and m.payload.layer != m.layer:
        raise MalformedPayload("payload layer disagrees with the message", peer=peer, value=m.layer)
    if m.kind == "outcome":
        if m.payload is not None or not 0 <= m.step <= m.iteration:
            raise RemoteProtocolError("malformed outcome", peer=peer, value=m.step)
        if any(s != site or it >= m.iteration for s, it in m.sites):
            raise RemoteProtocolError("outcome lists foreign or out-of-range ids", peer=peer)


def _check_blocks(peer: str, m: RoundMsg, n: int, shape: tuple[int, int] | None) -> None:
    if not 0 <= m.segment < n:
        raise RemoteProtocolError("segment out of range", peer=peer, value=m.segment)
    if m.payload is not None and m.payload.indices.shape[0] and shape is not None:
        bounds = segment_bounds(n_blocks(*shape), n)
        idx = m.payload.indices
        if idx[0] < bounds[m.segment] or idx[-1] >= bounds[m.segment + 1]:
            raise MalformedPayload("segment holds blocks outside its range", peer=peer, value=m.segment)


def check_ring_message(
    peer: str, plan: Plan, site: str, m: RoundMsg, shape: tuple[int, int] | None
) -> tuple[int, int]:
    """A ring message must come from our ring predecessor and hold only blocks of its segment; returns
    (ring size, our position)."""
    n = len(plan.core)
    if n < 2 or not plan.in_core(site) or plan.ring_prev(site) != peer:
        raise RemoteProtocolError("ring message from a site that is not our ring predecessor", peer=peer)
    _check_blocks(peer, m, n, shape)
    return n, plan.ring_position(site)


def check_allpairs_message(
    peer: str, plan: Plan, site: str, m: RoundMsg, shape: tuple[int, int] | None, pieces: int = 1
) -> None:
    """All-pairs: a ``segment`` (a slice for the reduce-scatter) must come from another core member and
    carry only blocks of piece ``step`` of the segment this member owns, or be that member's whole
    contribution (``segment`` -1, a direct round); a ``segment_final`` only from that segment's owner, with
    only blocks of that piece. ``pieces`` is this member's cut (:func:`~gateways.rounds.allpairs.piece_count`,
    the same at every member): a piece number or block outside it is refused before anything is stored.
    A part without payload (its sender knew no shape) is piece 0 and stands for the whole segment."""
    n = len(plan.core)
    if n < 2 or not plan.in_core(site) or not plan.in_core(peer) or peer == site:
        raise RemoteProtocolError("all-pairs message from a site outside the core", peer=peer)
    if m.kind == "segment" and m.segment == -1:  # a whole contribution (a direct round): any block
        if m.step != 0:
            raise RemoteProtocolError("malformed whole all-pairs part", peer=peer, value=m.step)
        return
    if not 0 <= m.segment < n:
        raise RemoteProtocolError("segment out of range", peer=peer, value=m.segment)
    if not 0 <= m.step < (pieces if m.payload is not None else 1):
        raise RemoteProtocolError("all-pairs piece out of range", peer=peer, value=m.step)
    if m.payload is not None and m.payload.indices.shape[0] and shape is not None:
        b = piece_bounds(n_blocks(*shape), n, pieces)
        v = m.segment * pieces + m.step
        idx = m.payload.indices
        if idx[0] < b[v] or idx[-1] >= b[v + 1]:
            raise MalformedPayload(
                "piece holds blocks outside its range", peer=peer, value=(m.segment, m.step)
            )
    if m.kind == "segment":
        if m.segment != plan.ring_position(site):
            raise RemoteProtocolError(
                "all-pairs part for a segment this member does not own", peer=peer, value=m.segment
            )
    elif plan.core[m.segment] != peer:
        raise RemoteProtocolError("finished segment not from its owner", peer=peer, value=m.segment)
