"""Parameter resync, the trainer's part: ask for the job's parameters, take a snapshot in, hand one out.

Sans-IO and framework-free (numpy arrays, one per layer in layer-id order), so the site leader of the
client API, the chaos soak's trainer and the test trainers run the very same checks. The gateway's part and
the flow are in :mod:`gateways.node.resync`; the messages in :mod:`wanrt.protocol.params`.

Asking (:class:`SnapshotReceiver`). A ``Notice`` of kind ``resync`` names J, the first iteration whose
results this site's gateway takes part in again; every result of an earlier iteration this trainer missed.
It asks (:meth:`SnapshotReceiver.on_notice` → ``ParamRequest``) and, until the snapshot is in, *holds* the
results it receives instead of applying them (they may already be in the snapshot). The snapshot holds
every result of the iterations below K (K ≥ J, the serving trainer's choice) and the ones listed in
``extras``; after swapping it in the trainer applies the held results :meth:`Snapshot.wants` says, and
from then on skips the results the snapshot already holds (:meth:`Snapshot.wants` again).

Integrity: the announce carries :func:`~wanrt.protocol.params.snapshot_checksum` of the values the
serving trainer sends; the receiver recomputes it over what it assembled and swaps in nothing that differs
(it asks again, up to ``MAX_CORRUPT`` times in a row, then fails with an error).

Memory: the announce is checked against this trainer's own layer lengths before anything is allocated;
the snapshot is assembled in one staging copy of the model (allocated from the trainer's own shapes, never
from the announce), so a half-received snapshot never touches the parameters and a transfer that restarts
(another peer) starts over in the same buffers.

Serving (:func:`snapshot_frames`, :func:`snapshot_point`). The serving trainer answers with its
parameters as they are when the request can be answered: K is the first iteration whose results it has
not all applied (it must be ≥ J: before that it waits), ``extras`` the results of iterations ≥ K it has
applied. No snapshot is kept in advance (the copy is made at answer time, only while a request is
pending), so serving costs nothing in steady state and one model copy per request.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from wanrt.errors import MalformedPayload, RemoteProtocolError
from wanrt.protocol import Notice, ParamAnnounce, ParamChunk, ParamRefuse, ParamRequest
from wanrt.protocol.params import CHECKSUM_BYTES, snapshot_checksum

__all__ = ["CHUNK_ELEMENTS", "Snapshot", "SnapshotReceiver", "snapshot_frames", "snapshot_point"]

#: Snapshots in a row that may fail their checksum before the resync gives up with an error.
MAX_CORRUPT = 3

#: Values per ParamChunk a trainer sends (1 MiB of fp32): well under the protocol's chunk limit.
CHUNK_ELEMENTS = 1 << 18

Key = tuple[int, int]


@dataclass(frozen=True)
class Snapshot:
    """The job's parameters: every result of the iterations below ``iteration`` and those in ``extras``."""

    iteration: int
    extras: frozenset[Key]
    layers: list[np.ndarray]
    #: the serving site's optimizer state (:mod:`wanrt.kernels.state_transfer`), empty if it was not sent
    state: list[np.ndarray] = field(default_factory=list)

    def wants(self, iteration: int, layer: int) -> bool:
        """Whether a result of (iteration, layer) must still be applied on top of this snapshot."""
        return iteration >= self.iteration and (iteration, layer) not in self.extras

    def ahead_of(self, upto: int) -> bool:
        """Whether it holds a result of an iteration after ``upto``: parameters a step that applies exactly
        the results up to ``upto`` (the outer loop's steps) must not have yet."""
        return self.iteration > upto + 1 or any(it > upto for it, _ in self.extras)


@dataclass
class SnapshotReceiver:
    """The asking side (see the module docstring). ``lengths``: this trainer's layers' dense lengths;
    ``state_lengths``: its optimizer's state arrays' (:func:`wanrt.kernels.state_transfer.state_lengths`)."""

    lengths: tuple[int, ...]
    state_lengths: tuple[int, ...] = ()
    peer: str = "gateway"
    pending: int | None = None  # J of the resync in progress
    done: int | None = None  # J of the last resync completed
    failed: int = 0
    corrupt: int = 0  # snapshots in a row that failed their checksum
    reask: bool = False  # the last snapshot failed its checksum: send ask_again()
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _request: int | None = None
    _staging: list[np.ndarray] | None = None
    _announce: ParamAnnounce | None = None
    _layer: int = 0
    _offset: int = 0

    @property
    def holding(self) -> bool:
        """Results received now must be held, not applied (a snapshot is on its way)."""
        return self.pending is not None

    def on_notice(self, notice: Notice) -> ParamRequest | None:
        """A ``resync`` notice: the request to send (again, after a reconnect), or None."""
        if notice.kind != "resync":
            return None
        j = notice.info.get("iteration")
        if type(j) is not int or j < 0:
            raise RemoteProtocolError("resync notice without an iteration", peer=self.peer)
        if self.done is not None and j <= self.done:
            return None
        if self.pending == j and self._request is not None:
            return None  # already asked on this connection (ask_again after a reconnect)
        if self.pending is None or j >= self.pending:
            self.pending = j
            self._reset()
            self._request = next(self._ids)
            return self._question(self._request, j)
        return None

    def _question(self, request: int, j: int) -> ParamRequest:
        return ParamRequest(request, j, self.lengths + self.state_lengths, len(self.state_lengths))

    def ask_again(self) -> ParamRequest | None:
        """After a reconnect, or a snapshot that failed its checksum (``reask``): the question again if a
        snapshot is still owed (the gateway may have relayed it in full; it answers a repeated question
        for the same iteration)."""
        self.reask = False
        if self.pending is None:
            return None
        self._reset()
        self._request = next(self._ids)
        return self._question(self._request, self.pending)

    def _reset(self) -> None:
        self._announce = None
        self._layer = self._offset = 0

    def on_refuse(self, msg: ParamRefuse) -> bool:
        """The transfer failed (the gateway asks another site and a new announce follows) or nobody will
        answer (no resync pending at the gateway: True, the caller stops holding and applies what it held)."""
        if msg.request != self._request:
            return False
        self._reset()
        if "no parameter resync is pending" in msg.reason:
            self.pending = self._request = None
            self.failed += 1
            return True
        return False

    def on_announce(self, msg: ParamAnnounce) -> None:
        if msg.request != self._request or self.pending is None:
            return
        full = self.lengths + self.state_lengths
        if not (msg.lengths == full and msg.state == len(self.state_lengths)) and not (
            msg.state == 0 and msg.lengths == self.lengths  # the parameters alone
        ):
            raise RemoteProtocolError(
                f"resync snapshot of {len(msg.lengths)} layers / {sum(msg.lengths)} values; this model has "
                f"{len(self.lengths)} / {sum(self.lengths)}",
                peer=self.peer,
            )
        if msg.iteration < self.pending:
            raise RemoteProtocolError(
                f"resync snapshot at iteration {msg.iteration}, asked for {self.pending}", peer=self.peer
            )
        if len(msg.checksum) != CHECKSUM_BYTES:
            raise RemoteProtocolError("resync snapshot without a checksum", peer=self.peer)
        if self._staging is None or len(self._staging) != len(msg.lengths):
            # from our own lengths (the announce matched them), never from the announce's numbers
            own = full if msg.state else self.lengths
            self._staging = [np.empty(n, np.float32) for n in own]
        self._announce = msg
        self._layer = self._offset = 0
        self._skip_empty()

    @property
    def _sizes(self) -> tuple[int, ...]:
        """The lengths of the transfer under way (the announce's, checked against ours)."""
        return self.lengths if self._announce is None else self._announce.lengths

    def _skip_empty(self) -> None:
        sizes = self._sizes
        while self._layer < len(sizes) and self._offset >= sizes[self._layer]:
            self._layer += 1
            self._offset = 0

    def on_chunk(self, msg: ParamChunk) -> Snapshot | None:
        """One chunk in; the whole snapshot once the last one is."""
        if msg.request != self._request or self._announce is None or self._staging is None:
            return None
        n = int(msg.values.size)
        sizes = self._sizes
        if (msg.layer, msg.offset) != (self._layer, self._offset) or msg.offset + n > sizes[msg.layer]:
            raise RemoteProtocolError(
                f"resync chunk for layer {msg.layer} at {msg.offset} (+{n}); expected layer {self._layer} "
                f"at {self._offset}",
                peer=self.peer,
            )
        if not msg.finite():
            raise MalformedPayload(f"resync chunk of layer {msg.layer} holds NaN or Inf", peer=self.peer)
        self._staging[msg.layer][msg.offset : msg.offset + n] = msg.values
        self._offset += n
        self._skip_empty()
        if self._layer < len(sizes):
            return None
        ann = self._announce
        if snapshot_checksum(self._staging) != ann.checksum:
            # assembled in full but not what the serving trainer sent: never swapped in; asked once more
            # (the gateway answers a repeated question), a few times at most
            self.corrupt += 1
            self._reset()
            if self.corrupt > MAX_CORRUPT:
                raise RemoteProtocolError(
                    f"{self.corrupt} resync snapshots in a row failed their checksum", peer=self.peer
                )
            self.reask = True
            return None
        n = len(self.lengths)
        snap = Snapshot(ann.iteration, frozenset(ann.extras), self._staging[:n], self._staging[n:])
        self.corrupt = 0
        self._staging = None  # handed over: the trainer swaps it in
        self.done, self.pending, self._request = self.pending, None, None
        self._reset()
        return snap


def snapshot_point(
    request_iteration: int, low: int, applied: Callable[[int, int], bool], high: int, n_layers: int
) -> tuple[int, tuple[Key, ...]] | None:
    """K and ``extras`` for answering now, or None (wait: the results below J are not all applied yet).

    ``low`` is the first iteration whose results are not all applied, ``applied(it, layer)`` says whether
    a result was, ``high`` is one past the highest iteration with an applied result."""
    if low < request_iteration:
        return None
    extras = tuple((it, la) for it in range(low, high) for la in range(n_layers) if applied(it, la))
    return low, extras


def snapshot_frames(
    request: int,
    iteration: int,
    extras: Sequence[Key],
    layers: Sequence[np.ndarray],
    chunk: int = CHUNK_ELEMENTS,
    state: Sequence[np.ndarray] = (),
) -> Iterator[ParamAnnounce | ParamChunk]:
    """The answer to ``request``: the announce, then the layers in order and the optimizer ``state``
    arrays after them, ``chunk`` values at a time (the arrays are copied into the frames, so the caller may
    go on training while they are sent)."""
    flats = [np.asarray(a, dtype=np.float32).reshape(-1) for a in [*layers, *state]]
    sizes = tuple(int(a.size) for a in flats)
    yield ParamAnnounce(request, iteration, sizes, tuple(extras), len(state), snapshot_checksum(flats))
    for layer, flat in enumerate(flats):
        for off in range(0, flat.size, chunk):
            yield ParamChunk(request, layer, off, flat[off : off + chunk].copy())
