"""Who takes part in the job from which iteration, decided from what two gateways tell each other.

The round engine computes every round's plan from (topology, live members), so gateways that disagree on
the members of an iteration disagree on the plan and wait for each other in vain. Membership changes are
therefore tied to iterations that both ends of a link compute from the same inputs: the handshake ``info``
maps (bound into the HMAC transcript, so neither can be altered in flight), here :class:`LinkInfo`:

* ``frontier`` — the newest iteration the sender has seen (-1: no round yet);
* ``fresh`` — the sender has no round engine yet (just started; it joins the job on its first link);
* ``join_at`` — on the *first* link a gateway opens to a peer after it joined, the iteration it joined at,
  so every peer that had lost it counts it in from the same iteration;
* ``live`` — the sender's live members, so a fresh gateway does not wait for sites the others lost;
* ``low`` — a running sender's oldest unfinished iteration (its oldest open round, else frontier + 1);
* ``joins`` — a running sender's joins still pending (``site:J`` pairs): a fresh
  gateway it lets in leaves each such site out of the plans before its J, as every running site does.

Rules (:func:`join_iteration`): a gateway that considers the other end lost calls
``RoundEngine.peer_joined(peer, J)`` with J = the peer's announced ``join_at`` if any, else
``max(frontiers) + 1 + margin`` (``margin`` = the engine's window, so J is ahead of every site's frontier),
or 0 when neither has seen a round (the job is starting). A fresh gateway starts its engine at that same J,
which its peer computes identically.

Two *running* gateways that lost each other (a link reset, a partition between just the two of them) take
each other back from ``min(low)`` instead: every round either still has open is re-planned with both, as it
is at every other site, which never lost either. With J = max(frontiers) + 1 + margin the pair kept plans
without each other for the rounds in between, which no other site runs: their partials were held by parents
that did not know those plans, a root waited for a quorum it could never see, and the whole job wedged
(chaos soak finding 1). Only while neither end is behind: both ends' oldest open rounds are within
``margin`` of the newest frontier, so the results of the rounds re-run are still kept everywhere
(``retain_finals`` > 2 windows) and answer them. A site cut off from everyone for longer fell behind the
job, whose results for its old rounds are pruned: re-run, those rounds would wait until pruned here and be
abandoned, their contributions carried though possibly counted (an engine experiment double-counted one
that way). It rejoins past every frontier as before, and the ``outcome`` messages of the round engine
settle the rounds it held with what the others counted. Sans-IO.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateways.rounds.config import RoundConfig
from wanrt.errors import RemoteProtocolError
from wanrt.protocol.limits import MAX_COUNTER, MAX_STR_CHARS

__all__ = ["LinkInfo", "initial_live", "join_iteration", "lost_on_suspect", "rounds_digest"]

_FRONTIER: Final = "frontier"
_FRESH: Final = "fresh"
_JOIN_AT: Final = "join_at"
_LIVE: Final = "live"
_LOW: Final = "low"
_JOINS: Final = "joins"


@dataclass(frozen=True)
class LinkInfo:
    """A gateway's membership entries in its handshake ``info`` (see the module docstring)."""

    frontier: int
    fresh: bool
    join_at: int | None = None
    live: tuple[str, ...] | None = None
    low: int | None = None
    joins: tuple[tuple[str, int], ...] = ()

    def to_info(self) -> dict[str, Any]:
        out: dict[str, Any] = {_FRONTIER: self.frontier, _FRESH: self.fresh}
        if self.join_at is not None:
            out[_JOIN_AT] = self.join_at
        if self.low is not None:
            out[_LOW] = self.low
        if self.live is not None:
            text = ",".join(sorted(self.live))
            if len(text) <= MAX_STR_CHARS:  # a huge job leaves it out: the fresh side then assumes everyone
                out[_LIVE] = text
        if self.joins:
            text = ",".join(f"{s}:{j}" for s, j in sorted(self.joins))
            if len(text) <= MAX_STR_CHARS:  # as for live: a fresh gateway then learns them as joins
                out[_JOINS] = text
        return out

    @classmethod
    def parse(cls, info: Mapping[str, Any], *, peer: str) -> LinkInfo:
        """Read the entries a peer gateway sent; a missing or mistyped one is the peer's fault."""
        frontier, fresh = info.get(_FRONTIER), info.get(_FRESH)
        if type(frontier) is not int or not -1 <= frontier <= MAX_COUNTER:
            raise RemoteProtocolError("gateway handshake lacks a valid frontier", peer=peer, value=frontier)
        if type(fresh) is not bool:
            raise RemoteProtocolError("gateway handshake lacks the fresh flag", peer=peer)
        join_at = info.get(_JOIN_AT)
        if join_at is not None and (type(join_at) is not int or not 0 <= join_at <= MAX_COUNTER):
            raise RemoteProtocolError("invalid join_at in the gateway handshake", peer=peer, value=join_at)
        low = info.get(_LOW)
        if low is not None and (type(low) is not int or not 0 <= low <= MAX_COUNTER):
            raise RemoteProtocolError("invalid low in the gateway handshake", peer=peer, value=low)
        live_text = info.get(_LIVE)
        live: tuple[str, ...] | None = None
        if live_text is not None:
            if not isinstance(live_text, str):
                raise RemoteProtocolError("invalid live list in the gateway handshake", peer=peer)
            live = tuple(s for s in live_text.split(",") if s)
        return cls(frontier, fresh, join_at, live, low, _parse_joins(info.get(_JOINS), peer))


def _parse_joins(text: Any, peer: str) -> tuple[tuple[str, int], ...]:
    if text is None:
        return ()
    if not isinstance(text, str) or len(text) > MAX_STR_CHARS:
        raise RemoteProtocolError("invalid joins in the gateway handshake", peer=peer)
    out = []
    for item in text.split(","):
        site, sep, at = item.rpartition(":")
        if not sep or not site or not at.isdigit() or int(at) > MAX_COUNTER:
            raise RemoteProtocolError("invalid joins entry in the gateway handshake", peer=peer, value=item)
        out.append((site, int(at)))
    return tuple(out)


def join_iteration(ours: LinkInfo, theirs: LinkInfo, *, margin: int, retained: int | None = None) -> int:
    """The iteration from which the *other* end (``theirs``) takes part, as both ends compute it.

    A fresh gateway starts its engine at ``join_iteration(peer's info, its own info)``: the J its peer
    uses for it (symmetric in the frontiers; the peer's own ``join_at`` is where the *peer* joined).
    ``retained`` (``margin`` if None) is how far behind the newest frontier either end's oldest open round
    may be for the two to take each other back from it (see the module docstring).
    """
    if theirs.join_at is not None:
        return theirs.join_at
    top = max(ours.frontier, theirs.frontier)
    lows = (ours.low, theirs.low)
    if ours.fresh or theirs.fresh or lows[0] is None or lows[1] is None:
        return 0 if top < 0 else top + 1 + margin
    if min(lows[0], lows[1]) >= top - (margin if retained is None else retained):
        # both running, neither behind the other: back into every round either still has open (never
        # past the fresh-join rule's J)
        return max(0, min(lows[0], lows[1], top + 1 + margin))
    return 0 if top < 0 else top + 1 + margin


def initial_live(ours: str, peer: str, theirs: LinkInfo, sites: Iterable[str]) -> set[str]:
    """The members a fresh gateway starts with: the peer's live view (plus both ends), else everyone."""
    everyone = set(sites)
    if theirs.live is None:
        return everyone
    return (set(theirs.live) & everyone) | {ours, peer}


def lost_on_suspect(link_up: bool) -> bool:
    """Whether a peer the round engine suspects (silent where it cannot be skipped) is declared lost.

    Liveness belongs to heartbeats: a peer whose link is up and answering is slow, not lost, and declaring
    it lost would re-plan every round in flight. A peer without a link cannot answer at all.
    """
    return not link_up


def rounds_digest(rounds: RoundConfig) -> bytes:
    """8 bytes naming the round settings: gateways whose plans would differ refuse each other's links."""
    return hashlib.blake2b(repr(rounds).encode(), digest_size=8).digest()
