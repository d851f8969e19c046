"""One authenticated link to a peer gateway, as the node sees it: framing, acks, pacing and liveness.

Everything a link decides lives here, without I/O: which frames go out next and when (control frames
first, then the EDF queue's chunks paced by the link's :class:`~gateways.sending.pacer.Pacer`), what the
received bytes mean (the protocol :class:`~wanrt.protocol.Connection` reassembles and checks frames,
:class:`~wanrt.protocol.peer.round_frames.RoundInbox` turns them into round messages), the cumulative ``Ack``
owed to the peer, and whether the peer has gone silent. Whoever moves the bytes — the daemon's reader and
writer tasks, or the simulator's link model — feeds :meth:`PeerChannel.receive` and drains
:meth:`PeerChannel.poll`; the node decides what received messages mean.

Why a message whose payload fits one chunk is one frame (:class:`~wanrt.protocol.peer.round_frames.RoundData`)
and one queue item: a small round then costs one frame and one chunk, not two of each. A larger payload
travels as a tag and a Push, the Push its own item, cut into chunks the peer reassembles; a chunked item
must be exactly one frame, so a tag is never merged with one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from gateways.sending.edf_queue import SendQueue
from gateways.sending.link_times import LinkTimes
from gateways.sending.pacer import Pacer
from gateways.sending.rx_dispersion import RxDispersion
from gateways.stats import LinkCounters
from wanrt.errors import LocalProtocolError
from wanrt.protocol import NEED_DATA, Ack, Bye, Chunk, Connection, ConnectionClosed, Heartbeat, Message, Push
from wanrt.protocol.checks import check_uint
from wanrt.protocol.limits import MAX_COUNTER, MAX_LAYER_ID
from wanrt.protocol.peer.probe_train import ProbeTrain
from wanrt.protocol.peer.round_frames import (
    SEQ_MODULUS,
    AckWindow,
    RoundData,
    RoundInbox,
    RoundTag,
    encode_round,
    round_data_wire,
)
from wanrt.protocol.peer.round_msg import RoundMsg

__all__ = ["WRITE_BATCH_BYTES", "PeerChannel", "SendOut"]

#: Bytes handed out in one :meth:`PeerChannel.poll` when the pacer lets them go together: fewer syscalls
#: for many small frames, still far below the transports' write buffer.
WRITE_BATCH_BYTES: Final = 256 * 1024


@dataclass(slots=True)
class SendOut:
    """What the link's writer does next: write ``parts`` now; then, if nothing was given, wait until
    ``wait_until`` (pacing) or until woken; ``done`` once our Bye is out and nothing else is owed."""

    parts: list[memoryview] = field(default_factory=list)
    wait_until: float | None = None
    done: bool = False


class PeerChannel:
    """See the module docstring. ``link_id`` tells this link apart from an earlier one to the same peer."""

    def __init__(
        self,
        link_id: int,
        peer: str,
        conn: Connection,
        *,
        queue: SendQueue,
        item_ids: Iterator[int],
        pacer: Pacer,
        link_times: LinkTimes,
        counters: LinkCounters,
        now: float,
        rx: RxDispersion | None = None,
    ) -> None:
        self.link_id = link_id
        self.peer = peer
        self.conn = conn
        self.pacer = pacer
        self.counters = counters
        self._queue = queue
        self._item_ids = item_ids
        self._link_times = link_times
        self._inbox = RoundInbox(peer, conn.job)
        self._acks = AckWindow(peer)
        self._control: deque[list[memoryview]] = deque()
        self._tag_items: dict[int, int] = {}  # EDF item id of a tag -> its sequence number
        self._merged: set[int] = set()  # items holding a tag and its payload frame (always one chunk)
        self._unpaced: set[int] = set()  # items that pass the pacer (timed probe trains)
        self._chunk_unpaced = False  # the frame _next_frame just gave is one of theirs
        self._seq = 0
        self._held: tuple[list[memoryview], float] | None = None  # a paced frame and when it may leave
        self.bye_sent = False
        self.ended = False
        self.last_rx = now
        self.next_beat = now
        self.beats = 0
        #: round messages sent before the peer said anything on this link (None once it did): the peer may
        #: never have brought the link up (it refused the handshake after our Auth), so if the link ends
        #: before then, they are queued again for the next link (PeerSide.end_link)
        self.unconfirmed: list[RoundMsg] | None = []
        #: the owner's "may have bytes to write" set: every frame queued here enters it, so the owner's
        #: pop_actions looks at the channels that changed, not at every link (``None``: not tracked)
        self.outbox: dict[int, PeerChannel] | None = None
        #: the peer → us link's tail-dispersion samples (kept across reconnects by the owner), and the
        #: stream position where the last message that was not a control frame ended: a message's wire
        #: extent runs from there (control frames interleave with a chunked message's chunks)
        self.rx = rx
        if rx is not None:
            rx.new_stream()
        self._rx_mark = 0 if rx is None else rx.total

    # -- out ----------------------------------------------------------------------------------------

    def send_round(self, msg: RoundMsg) -> None:
        """Frame one round message and queue it by (iteration, layer) for EDF."""
        if self.unconfirmed is not None:
            self.unconfirmed.append(msg)
        seq = self._seq
        self._seq += 1
        if self.outbox is not None:
            self.outbox[self.link_id] = self
        priority = (msg.iteration, msg.layer)
        p = msg.payload
        if p is not None and p.indices.nbytes + p.values.nbytes <= self._queue.chunk_bytes // 2:
            # one frame, one chunk, if the whole message fits one (a payload encodes to at most its size
            # plus a few bytes per block, so half a chunk of raw payload is a safe test before encoding);
            # joined into one part, or the queue would cut it at its first part of coalesce_bytes or more
            frame = self.conn.send_header(RoundData, *round_data_wire(msg, seq=seq))
            nbytes = sum(map(len, frame))
            if nbytes <= self._queue.chunk_bytes:
                item = next(self._item_ids)
                self._tag_items[item] = seq
                self._link_times.queued(self.peer, seq, msg.iteration, nbytes)
                self._queue.push(item, self.peer, priority, [memoryview(b"".join(frame))])
                return
        tag, payload = encode_round(msg, seq=seq, job=self.conn.job, site=self.conn.site)
        tag_parts = self.conn.send_parts(tag)
        tag_item = next(self._item_ids)
        self._tag_items[tag_item] = seq
        parts = [] if payload is None else self.conn.send_parts(payload)
        nbytes = sum(map(len, tag_parts)) + sum(map(len, parts))
        self._link_times.queued(self.peer, seq, msg.iteration, nbytes)
        if payload is None:
            self._queue.push(tag_item, self.peer, priority, tag_parts)
            return
        if nbytes < self._queue.coalesce_bytes:
            self._queue.push(tag_item, self.peer, priority, [*tag_parts, *parts])
            self._merged.add(tag_item)
        else:
            self._queue.push(tag_item, self.peer, priority, tag_parts)
            self._queue.push(next(self._item_ids), self.peer, priority, parts)

    def send_control(self, msg: Message) -> None:
        """Queue a small control frame (sent before any queued data); nothing after our Bye."""
        if self.bye_sent:
            return
        if self.outbox is not None:
            self.outbox[self.link_id] = self
        self._control.append(self.conn.send_parts(msg))
        if isinstance(msg, Bye):
            self.bye_sent = True

    def send_bulk(self, msg: Message, priority: tuple[int, int], *, paced: bool = True) -> None:
        """Queue a large frame that is not a round message (a parameter-resync chunk) in the EDF queue at
        ``priority``: paced like round data and cut into chunks, so it never starves the rounds.
        ``paced=False`` (a timed probe train, :mod:`wanrt.protocol.peer.probe_train`): its chunks pass the
        pacer, so the train measures the link and not the pacer's rate (they still wait their turn)."""
        if self.bye_sent:
            return
        if self.outbox is not None:
            self.outbox[self.link_id] = self
        item = next(self._item_ids)
        if not paced:
            self._unpaced.add(item)
        self._queue.push(item, self.peer, priority, self.conn.send_parts(msg))

    def heartbeat(self, now: float) -> None:
        self.beats += 1
        self.send_control(Heartbeat(self.beats, now))

    def due(self, lost_after: float) -> float:
        """The earliest time the owner's tick has something to do for this link (beat, or silence)."""
        nb, lost = self.next_beat, self.last_rx + lost_after
        return nb if nb < lost else lost

    def pending(self) -> bool:
        return bool(self._control) or self._held is not None or self._queue.pending(self.peer)

    def poll(self, now: float) -> SendOut:
        """The next bytes to write (control frames first, then paced EDF chunks), or when to ask again."""
        out = SendOut()
        if self._control:
            out.parts = [p for frame in self._control for p in frame]
            self._control.clear()
            self._count_out(out.parts)
            return out
        if self.bye_sent:
            out.done = True
            return out
        size = 0
        while size < WRITE_BATCH_BYTES:
            if self._held is not None:
                frame, ready_at = self._held
                if ready_at > now:
                    out.wait_until = ready_at
                    break
                self._held = None
            else:
                nxt = self._next_frame(now)
                if nxt is None:
                    break
                frame = nxt
                # reserves the bytes (a probe train passes: wanrt/protocol/peer/probe_train.py)
                wait = 0.0 if self._chunk_unpaced else self.pacer.delay(sum(map(len, frame)), now)
                if wait > 0:
                    self._held = (frame, now + wait)  # the pacer's slot for it: first out next time
                    continue
            out.parts.extend(frame)
            size += sum(map(len, frame))
        self._count_out(out.parts)
        return out

    def _next_frame(self, now: float) -> list[memoryview] | None:
        chunk = self._queue.next_chunk(self.peer)
        if chunk is None:
            return None
        self._chunk_unpaced = chunk.item_id in self._unpaced
        if self._chunk_unpaced and chunk.last:
            self._unpaced.discard(chunk.item_id)
        if chunk.offset == 0:
            seq = self._tag_items.pop(chunk.item_id, None)
            if seq is not None:
                self._link_times.started(self.peer, seq, now)
        if chunk.offset == 0 and chunk.last:
            self._merged.discard(chunk.item_id)
            return [chunk.data]  # whole frames fit one chunk: no Chunk envelope needed
        if chunk.item_id in self._merged:
            raise LocalProtocolError("a two-frame queue item was cut into chunks")
        return self.conn.send_parts(Chunk(chunk.item_id, chunk.offset, chunk.total, chunk.data))

    def _count_out(self, parts: list[memoryview]) -> None:
        if parts:
            self.counters.bytes_sent += sum(map(len, parts))
            self.counters.messages_sent += 1

    # -- in -----------------------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> Iterator[Message | ConnectionClosed]:
        """Feed bytes; yields each complete message (protocol violations raise from the Connection)."""
        self.counters.bytes_received += len(data)
        self.last_rx = now
        if self.rx is not None:
            self.rx.read(now, len(data))
        self.conn.receive_data(data)
        return self.events()

    def events(self) -> Iterator[Message | ConnectionClosed]:
        """Every message already buffered in the connection (also the bytes read with the handshake)."""
        while True:
            event = self.conn.next_event()
            if event is NEED_DATA:
                return
            self.counters.messages_received += 1
            assert isinstance(event, (Message, ConnectionClosed))
            rx = self.rx
            if rx is not None and not isinstance(event, (Ack, Heartbeat, ConnectionClosed)):
                end = rx.total - self.conn.unread_bytes
                size = end - self._rx_mark
                if isinstance(event, ProbeTrain):
                    # a train goes at the lowest priority, so round messages often end inside it and
                    # move the mark: its extent is at least its own bytes (the bytes between are the
                    # link's too, so its tail still reads the rate)
                    size = max(size, event.nbytes)
                rx.message(end, size)
                self._rx_mark = end
            yield event

    @property
    def sent_seq(self) -> int:
        """The sequence number of the last round message queued (-1: none yet)."""
        return self._seq - 1

    def confirm(self) -> None:
        """The peer sent something on this link: it has the link up too."""
        self.unconfirmed = None

    def on_tag(self, tag: RoundTag) -> RoundMsg | None:
        return self._inbox.on_tag(tag)

    def on_data(self, msg: RoundData) -> RoundMsg:
        return self._inbox.on_data(msg)

    def on_payload(self, msg: Push) -> tuple[RoundTag, RoundMsg]:
        return self._inbox.on_payload(msg)

    def taken(self, tag: RoundTag) -> None:
        self._acks.taken(tag)

    def acked_seq(self, ack: Ack) -> int:
        """Our sequence number an ack names: the newest message we sent that is congruent to it."""
        last = self._seq - 1
        return last - (last - ack.round) % SEQ_MODULUS

    def flush_ack(self) -> None:
        """Everything received so far was handed out: one cumulative Ack for what was taken since the last.

        Framed from its wire form (``Ack(*due).to_wire()``, the same checks): one per round message
        received, half of a many-site round's frames, where building the dataclass cost as much as
        framing it."""
        due = self._acks.due()
        if due is not None and not self.bye_sent:
            iteration, layer, round_ = due
            check_uint(iteration, "iteration", MAX_COUNTER)
            check_uint(layer, "layer", MAX_LAYER_ID)
            check_uint(round_, "round", MAX_LAYER_ID)
            if self.outbox is not None:
                self.outbox[self.link_id] = self
            header = {"iteration": iteration, "layer": layer, "round": round_}
            self._control.append(self.conn.send_header(Ack, header, []))
