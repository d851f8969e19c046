"""Live parameter resync, the gateway's part: who asks whom, and what a peer may send back. Sans-IO.

A site whose trainer missed rounds (its gateway restarted from a ``state_file`` frontier behind its join
iteration J, or a rejoin settled its held rounds without results) must get the job's parameters, or it
trains on a model that differs from every other site's for good (chaos soak: ``ranks_identical_at_end``).
The flow (docs/chaos.md, "Parameter resync"; messages in :mod:`wanrt.protocol.params`):

1. the gateway tells its trainer: ``Notice`` kind ``resync``, ``info["iteration"] = J`` (again on every
   reconnect until a snapshot went through);
2. the trainer asks: ``ParamRequest(J, lengths)`` with its layers' dense lengths. Its model passed the
   job's signature check (per-layer digests over name, shape and dtype), so the lengths are the job's;
   their count must equal the agreed signature's ``n_layers``; after them come ``state`` lengths of its
   optimizer's state arrays (:mod:`wanrt.kernels.state_transfer`), which travel after the layers;
3. the gateway asks one running peer (the parent in the plan of J if it has a link, else the other live
   members in name order), over the authenticated gateway link;
4. the peer gateway answers only a current member of the job, for an iteration no further past its
   frontier than a join may be claimed (:meth:`PeerAdmission._check_claims`), and hands the question to its
   own trainer, which answers with its snapshot (``ParamAnnounce`` then ``ParamChunk`` s) — relayed as is;
5. this gateway checks the announce against the lengths of step 2 *before* its trainer allocates
   anything (the optimizer state may be left out: the serving site's optimizer differs), and every chunk:
   exactly the next range in layer order, finite values. Anything else is the peer's fault:
   :class:`~wanrt.errors.RemoteProtocolError`, which ends that link. A refusal, or the link going down,
   moves the question to the next peer. The announce's checksum is relayed as is: the asking trainer
   verifies it over what it assembled (end to end, past every relay).

Nothing here allocates per value: chunks are checked and relayed, the trainer writes them into its own
parameters. The snapshot's iteration K ≥ J is the serving trainer's choice (the first iteration whose
results it has not all applied when asked, or later): the asking trainer holds the results it receives
meanwhile and, after swapping in the snapshot, applies those of iterations ≥ K the snapshot does not hold
(the announce lists the ones it does).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field, replace
from typing import Final

from wanrt.errors import MalformedPayload, RemoteProtocolError
from wanrt.protocol import Message, Notice, ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest
from wanrt.protocol.params import MAX_PARAM_EXTRAS

__all__ = ["RETRY_S", "ParamResync", "ResyncStats", "ToPeer", "ToSiteTrainer"]

log = logging.getLogger("gateways.node")

#: How long to wait before asking again when every peer refused (no trainer there yet, all links down).
RETRY_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class ToPeer:
    """Send ``msg`` on the link to ``peer``; ``bulk`` (a chunk's priority) goes through the EDF queue,
    paced like round data, otherwise it is a small control frame."""

    peer: str
    msg: Message
    bulk: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class ToSiteTrainer:
    """Send ``msg`` to this site's trainer (if one is connected)."""

    msg: Message


Out = ToPeer | ToSiteTrainer


@dataclass
class ResyncStats:
    requested: int = 0  # resyncs this site needed
    asked: int = 0  # questions sent to peers
    refused: int = 0  # refusals received
    refused_non_member: int = 0  # questions of sites that are not members here (answered with a refusal)
    completed: int = 0  # snapshots relayed to this site's trainer in full
    served: int = 0  # questions of peers handed to this site's trainer
    values_in: int = 0
    values_out: int = 0


@dataclass
class _Ask:
    """One question to a peer: what it may answer, and how far the answer got."""

    peer: str
    iteration: int
    lengths: tuple[int, ...]  # the layers', then ``state`` optimizer-state arrays' (empty: none asked)
    forward: bool  # False: the trainer that asked is gone; the answer is checked and dropped
    state: int = 0
    announced: bool = False
    layer: int = 0
    offset: int = 0

    def skip_empty(self) -> None:
        while self.layer < len(self.lengths) and self.offset >= self.lengths[self.layer]:
            self.layer += 1
            self.offset = 0

    @property
    def complete(self) -> bool:
        return self.announced and self.layer >= len(self.lengths)


@dataclass(frozen=True)
class _TrainerQuestion:
    """This site's trainer's ParamRequest: its id for it and the array lengths it expects (layers, then
    ``state`` optimizer-state arrays) — one record, so a question is dropped whole."""

    request: int
    lengths: tuple[int, ...]
    state: int


@dataclass
class _Serve:
    peer: str
    request: int  # the peer's id for it
    iteration: int
    remaining: int | None = None  # values still to relay once the trainer announced its answer


@dataclass
class ParamResync:
    """Both ends of a resync at one gateway (see the module docstring)."""

    site: str
    stats: ResyncStats = field(default_factory=ResyncStats)
    need: int | None = None  # J: this site's trainer must fetch the parameters (None: nothing pending)
    done_at: int | None = None  # J of the last snapshot relayed in full (a trainer that lost it may re-ask)
    trainer_up: bool = False
    _question: _TrainerQuestion | None = None  # the trainer's open question (None: none)
    _asks: dict[int, _Ask] = field(default_factory=dict)  # our id -> question
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _last_id: int = 0
    _tried: set[str] = field(default_factory=set)
    retry_at: float | None = None
    _serving: dict[int, _Serve] = field(default_factory=dict)  # our id (to our trainer) -> peer's question

    # -- this site needs the parameters --------------------------------------------------------------

    def notice(self) -> Notice | None:
        if self.need is None:
            return None
        return Notice(
            self.site,
            "resync",
            f"this site's trainer missed the job's rounds before iteration {self.need}: fetch the job's "
            "parameters from a running site",
            False,
            {"iteration": self.need},
        )

    def start(self, iteration: int) -> list[Out]:
        """This site's trainer missed rounds before ``iteration``: tell it (now, or when it connects)."""
        if self.need is not None and iteration <= self.need:
            return []
        self.need = iteration
        self.stats.requested += 1
        for ask in self._asks.values():
            ask.forward = False  # an older resync's answer: superseded
        self._question = None
        log.warning(
            "this site's trainer missed rounds before iteration %d: parameter resync needed", iteration
        )
        notice = self.notice()
        return [ToSiteTrainer(notice)] if notice is not None and self.trainer_up else []

    def trainer_connected(self) -> list[Out]:
        """A (new) trainer session: questions the old one was answering are refused (it cannot finish
        them), and the new one is told of a pending resync."""
        out = self.trainer_left()
        self.trainer_up = True
        notice = self.notice()
        return out if notice is None else [*out, ToSiteTrainer(notice)]

    def trainer_left(self) -> list[Out]:
        self.trainer_up = False
        self._question = None
        for ask in self._asks.values():
            ask.forward = False
        out: list[Out] = [
            ToPeer(s.peer, ParamRefuse(s.request, f"the trainer of site {self.site} went away"))
            for s in self._serving.values()
        ]
        self._serving.clear()
        return out

    def from_trainer(
        self, msg: Message, n_layers: int | None, candidates: list[str], now: float
    ) -> list[Out]:
        """A resync message from this site's trainer: its own question, or its answer to a peer's."""
        if isinstance(msg, ParamRequest):
            return self._trainer_asks(msg, n_layers, candidates, now)
        if isinstance(msg, (ParamAnnounce, ParamChunk, ParamRefuse)):
            serve = self._serving.get(msg.request)
            if serve is None:
                return []  # the peer's question was dropped meanwhile (its link ended, a newer one)
            if isinstance(msg, ParamChunk):
                if not msg.finite():
                    raise MalformedPayload("the trainer's snapshot holds NaN or Inf values", peer="trainer")
                self.stats.values_out += int(msg.values.size)
                if serve.remaining is not None:
                    serve.remaining -= int(msg.values.size)
                    if serve.remaining <= 0:
                        del self._serving[msg.request]  # answered in full
                return [
                    ToPeer(
                        serve.peer,
                        ParamChunk(serve.request, msg.layer, msg.offset, msg.values),
                        (serve.iteration, msg.layer),
                    )
                ]
            if isinstance(msg, ParamAnnounce):
                serve.remaining = sum(msg.lengths)
                if serve.remaining == 0:
                    del self._serving[msg.request]
                return [ToPeer(serve.peer, replace(msg, request=serve.request))]  # checksum and all
            del self._serving[msg.request]
            return [ToPeer(serve.peer, ParamRefuse(serve.request, msg.reason))]
        raise RemoteProtocolError(f"{type(msg).__name__} is not a resync message", peer="trainer")

    def _trainer_asks(
        self, msg: ParamRequest, n_layers: int | None, candidates: list[str], now: float
    ) -> list[Out]:
        if self.need is None and msg.iteration == self.done_at:
            # relayed in full, but the trainer's connection ended before it had all of it: once more
            self.need = msg.iteration
            self.stats.requested += 1
        if self.need is None or msg.iteration != self.need:
            return [
                ToSiteTrainer(ParamRefuse(msg.request, "no parameter resync is pending for that iteration"))
            ]
        if n_layers is None:
            return [ToSiteTrainer(ParamRefuse(msg.request, "the job's model signature is not known yet"))]
        if len(msg.lengths) - msg.state != n_layers:
            raise RemoteProtocolError(
                f"resync request describes {len(msg.lengths) - msg.state} layers, the job's model has "
                f"{n_layers}",
                peer="trainer",
                value=len(msg.lengths),
            )
        for ask in self._asks.values():
            ask.forward = False
        self._question = _TrainerQuestion(msg.request, msg.lengths, msg.state)
        self._tried.clear()
        return self._ask_next(candidates, now)

    def _active(self) -> bool:
        return any(a.forward for a in self._asks.values())

    def _ask_next(self, candidates: list[str], now: float) -> list[Out]:
        q = self._question
        if self.need is None or q is None or self._active():
            return []
        for peer in candidates:
            if peer in self._tried:
                continue
            self._tried.add(peer)
            rid = next(self._ids)
            self._last_id = rid
            self._asks[rid] = _Ask(peer, self.need, q.lengths, forward=True, state=q.state)
            self.stats.asked += 1
            self.retry_at = None
            log.info("asking site %s for the job's parameters as of iteration %d", peer, self.need)
            return [ToPeer(peer, ParamRequest(rid, self.need, state=q.state))]
        self._tried.clear()
        self.retry_at = now + RETRY_S
        return []

    def retry(self, candidates: list[str], now: float) -> list[Out]:
        """A link came up, or the retry time came: ask again if a question is owed."""
        if self.retry_at is not None and now < self.retry_at and not (set(candidates) - self._tried):
            return []
        self.retry_at = None
        return self._ask_next(candidates, now)

    # -- a peer's messages ---------------------------------------------------------------------------

    def from_peer(
        self,
        peer: str,
        msg: Message,
        *,
        member: bool,
        frontier: int,
        claim_margin: int,
        trainer_up: bool,
        candidates: list[str],
        now: float,
    ) -> list[Out]:
        """A resync message on the link to ``peer``. ``member``: ``peer`` is a live member of the job here;
        ``claim_margin``: how far past a frontier an iteration may be claimed. Raises RemoteProtocolError
        (the link ends) for anything its place does not allow."""
        if isinstance(msg, ParamRequest):
            return self._peer_asks(peer, msg, member, frontier, claim_margin, trainer_up)
        ask = (
            self._asks.get(msg.request) if isinstance(msg, (ParamAnnounce, ParamChunk, ParamRefuse)) else None
        )
        if ask is None or ask.peer != peer:
            if isinstance(msg, (ParamAnnounce, ParamChunk, ParamRefuse)) and 0 < msg.request <= self._last_id:
                return []  # an answer to a question given up on (another peer asked since): dropped
            raise RemoteProtocolError(
                f"{type(msg).__name__} for a parameter request this site never sent to {peer}",
                peer=peer,
                value=getattr(msg, "request", None),
            )
        if isinstance(msg, ParamRefuse):
            del self._asks[msg.request]
            self.stats.refused += 1
            log.info("site %s cannot send the parameters: %s", peer, msg.reason)
            return self._ask_next(candidates, now) if ask.forward else []
        if isinstance(msg, ParamAnnounce):
            self._check_announce(peer, ask, msg, frontier, claim_margin)
            ask.announced = True
            ask.skip_empty()
            out: list[Out] = []
            if ask.forward and self._question is not None:
                out.append(ToSiteTrainer(replace(msg, request=self._question.request)))
            return out + self._finish(msg.request, ask)
        assert isinstance(msg, ParamChunk)
        self._check_chunk(peer, ask, msg)
        ask.offset += int(msg.values.size)
        ask.skip_empty()
        self.stats.values_in += int(msg.values.size)
        out = []
        if ask.forward and self._question is not None:
            out.append(ToSiteTrainer(ParamChunk(self._question.request, msg.layer, msg.offset, msg.values)))
        return out + self._finish(msg.request, ask)

    def _finish(self, rid: int, ask: _Ask) -> list[Out]:
        if not ask.complete:
            return []
        del self._asks[rid]
        if ask.forward and self.need == ask.iteration:
            self.stats.completed += 1
            log.info(
                "parameters from site %s relayed to this site's trainer (resync at %d done)",
                ask.peer,
                ask.iteration,
            )
            self.need, self.done_at = None, ask.iteration
            self._question = None
        return []

    def _peer_asks(
        self, peer: str, msg: ParamRequest, member: bool, frontier: int, claim_margin: int, trainer_up: bool
    ) -> list[Out]:
        if not member:
            # refused, not a protocol violation: an honest site may ask in the moment between this site
            # counting it out and its link ending; a cheat gets nothing either way
            self.stats.refused_non_member += 1
            log.warning("site %s asks for the job's parameters but is not a member of the job here", peer)
            return [ToPeer(peer, ParamRefuse(msg.request, f"site {peer} is not a member of the job here"))]
        if msg.lengths:
            raise RemoteProtocolError("a gateway's parameter request carries no lengths", peer=peer)
        limit = frontier + claim_margin
        if msg.iteration > limit:
            raise RemoteProtocolError(
                f"site {peer} asks for parameters as of iteration {msg.iteration}, but this site is at "
                f"{frontier} (at most {limit} is believed)",
                peer=peer,
                value=msg.iteration,
            )
        for lid in [k for k, s in self._serving.items() if s.peer == peer]:
            del self._serving[lid]  # one question per peer: a newer one replaces it
        if not trainer_up:
            return [ToPeer(peer, ParamRefuse(msg.request, f"no trainer is connected at site {self.site}"))]
        lid = next(self._ids)
        self._last_id = max(self._last_id, lid)
        self._serving[lid] = _Serve(peer, msg.request, msg.iteration)
        self.stats.served += 1
        log.info(
            "site %s asks for the job's parameters as of iteration %d: asking this site's trainer",
            peer,
            msg.iteration,
        )
        return [ToSiteTrainer(ParamRequest(lid, msg.iteration, state=msg.state))]

    def _check_announce(self, peer: str, ask: _Ask, msg: ParamAnnounce, frontier: int, margin: int) -> None:
        if ask.announced:
            raise RemoteProtocolError("a second parameter announce for one request", peer=peer)
        # bounded against the model the job agreed on (the asking trainer's lengths, whose count is the
        # signature's) before the trainer reserves anything; the optimizer state may be left out (the
        # serving site's optimizer differs, or keeps none)
        layers = ask.lengths[: len(ask.lengths) - ask.state]
        if msg.state == 0 and ask.state and msg.lengths == layers:
            ask.lengths, ask.state = layers, 0
        if msg.lengths != ask.lengths or msg.state != ask.state:
            n, total = len(msg.lengths), sum(msg.lengths)
            raise RemoteProtocolError(
                f"site {peer} announces parameters of {n} layers / {total} values; the job's model has "
                f"{len(ask.lengths)} layers / {sum(ask.lengths)} values",
                peer=peer,
                value=(n, total),
            )
        k = msg.iteration
        if k < ask.iteration or k > max(frontier, ask.iteration) + margin:
            raise RemoteProtocolError(
                f"site {peer} announces a snapshot at iteration {k}, asked for {ask.iteration} (frontier "
                f"{frontier})",
                peer=peer,
                value=k,
            )
        if len(msg.extras) > min(MAX_PARAM_EXTRAS, len(layers) * (margin + 1)):
            raise RemoteProtocolError("too many results beyond the snapshot's iteration", peer=peer)
        for it, layer in msg.extras:
            if not k <= it <= k + margin or layer >= len(layers):
                raise RemoteProtocolError(
                    "a result beyond the snapshot's iteration is out of range", peer=peer, value=(it, layer)
                )

    def _check_chunk(self, peer: str, ask: _Ask, msg: ParamChunk) -> None:
        if not ask.announced:
            raise RemoteProtocolError("a parameter chunk before its announce", peer=peer)
        n = int(msg.values.size)
        if ask.layer >= len(ask.lengths) or (msg.layer, msg.offset) != (ask.layer, ask.offset):
            raise RemoteProtocolError(
                f"parameter chunk for layer {msg.layer} at {msg.offset}; expected layer {ask.layer} at "
                f"{ask.offset}",
                peer=peer,
                value=(msg.layer, msg.offset),
            )
        if msg.offset + n > ask.lengths[msg.layer]:
            raise RemoteProtocolError(
                f"parameter chunk runs past layer {msg.layer}'s {ask.lengths[msg.layer]} values",
                peer=peer,
                value=msg.offset + n,
            )
        if not msg.finite():
            raise MalformedPayload(f"parameter chunk of layer {msg.layer} holds NaN or Inf", peer=peer)

    def link_ended(self, peer: str, candidates: list[str], now: float) -> list[Out]:
        """The link to ``peer`` is gone: its questions are dropped, ours to it go to another peer."""
        for lid in [k for k, s in self._serving.items() if s.peer == peer]:
            del self._serving[lid]
        lost = [rid for rid, a in self._asks.items() if a.peer == peer]
        was_active = any(self._asks[rid].forward for rid in lost)
        for rid in lost:
            del self._asks[rid]
        if was_active and self._question is not None:
            # the trainer drops what it received: the next announce starts the snapshot over
            reason = f"the link to site {peer} went down during the transfer; asking another site"
            refuse = ParamRefuse(self._question.request, reason)
            return [ToSiteTrainer(refuse), *self._ask_next(candidates, now)]
        return []
