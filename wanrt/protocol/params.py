"""Parameter resync messages: a site whose trainer missed rounds gets the job's parameters from a peer site.

Why. A gateway restarted from a ``state_file`` frontier behind its join iteration J (or a rejoin that
settled its held rounds without results) leaves its trainer without the results of the rounds the job
finished meanwhile; an empty aggregate only unblocks it, its parameters differ from every other site's for
good. The gateway tells its trainer (``Notice`` kind ``resync`` with ``info["iteration"] = J``), the
trainer asks (:class:`ParamRequest`), the gateway asks a running peer gateway, which asks its own trainer;
the answer is one :class:`ParamAnnounce` (the snapshot's iteration K ≥ J, the dense length of every layer,
and the results of iterations ≥ K the snapshot already holds) followed by :class:`ParamChunk` frames in
layer order, relayed back the same way (docs/chaos.md, "Parameter resync"). :class:`ParamRefuse` says that
a request cannot be answered (no trainer there, the link went away), so the asker tries another peer.

The same four messages travel on trainer links (core registry) and between gateways (the gateway registry
includes the core one); every hop re-numbers ``request`` with its own ids. Sizes travel in buffers, never
in the msgpack header (a model has more layers than a header array may hold). Each receiver checks the
announced lengths against the model the job agreed on *before* allocating anything
(:mod:`gateways.node.resync`, and the client against its own model), and every chunk's layer and range
against the announce.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Self

import numpy as np

from wanrt.errors import LocalProtocolError
from wanrt.protocol.checks import check_count, check_text, check_uint
from wanrt.protocol.limits import MAX_COUNTER, MAX_LAYER_ELEMENTS, MAX_LAYER_ID
from wanrt.protocol.messages import Message, MsgType, field_names

__all__ = [
    "CHECKSUM_BYTES",
    "MAX_PARAM_CHUNK_ELEMENTS",
    "MAX_PARAM_EXTRAS",
    "MAX_PARAM_LAYERS",
    "MAX_STATE_PER_LAYER",
    "PARAM_MESSAGES",
    "ParamAnnounce",
    "ParamChunk",
    "ParamRefuse",
    "ParamRequest",
    "snapshot_checksum",
]

#: Layers one resync may describe: the client's own bound on a model's layers (wanrt.client.context).
MAX_PARAM_LAYERS: Final = 1 << 20
#: fp32 values in one chunk (4 MiB): small enough to interleave with round traffic in the EDF queue,
#: large enough that a 100 M-parameter model is ~100 frames.
MAX_PARAM_CHUNK_ELEMENTS: Final = 1 << 20
#: (iteration, layer) results of iterations ≥ K a snapshot may already hold: a trainer applies a layer at
#: most ``staleness`` iterations late, so a few iterations of every layer; bounded by the layer count too.
MAX_PARAM_EXTRAS: Final = 1 << 22
#: Optimizer-state arrays per layer a resync may carry (Adam: exp_avg, exp_avg_sq, step counters).
MAX_STATE_PER_LAYER: Final = 3
#: Bytes of a snapshot's checksum (:func:`snapshot_checksum`).
CHECKSUM_BYTES: Final = 16


def _u64_array(buf: Any, field: str, limit_name: str, limit: int) -> np.ndarray:
    mv = memoryview(buf)
    if mv.nbytes % 8:
        raise LocalProtocolError(f"{field} buffer is not a whole number of u64", value=mv.nbytes)
    check_count(mv.nbytes // 8, field, limit_name, limit)
    return np.frombuffer(mv, dtype="<u8")


def _lengths(value: Any) -> tuple[int, ...]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        arr = _u64_array(value, "lengths", "MAX_PARAM_LAYERS", MAX_PARAM_LAYERS)
        if arr.size and int(arr.max()) > MAX_LAYER_ELEMENTS:
            raise LocalProtocolError("a layer length exceeds MAX_LAYER_ELEMENTS", value=int(arr.max()))
        return tuple(int(x) for x in arr)
    if not isinstance(value, (tuple, list)):
        raise LocalProtocolError("lengths must be a sequence of layer lengths", value=type(value).__name__)
    check_count(len(value), "lengths", "MAX_PARAM_LAYERS", MAX_PARAM_LAYERS)
    return tuple(check_uint(v, "layer length", MAX_LAYER_ELEMENTS) for v in value)


def _extras(value: Any) -> tuple[tuple[int, int], ...]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        arr = _u64_array(value, "extras", "MAX_PARAM_EXTRAS", 2 * MAX_PARAM_EXTRAS)
        if arr.size % 2:
            raise LocalProtocolError("extras must be (iteration, layer) pairs", value=int(arr.size))
        pairs = arr.reshape(-1, 2)
        if pairs.size and (int(pairs[:, 0].max()) > MAX_COUNTER or int(pairs[:, 1].max()) > MAX_LAYER_ID):
            raise LocalProtocolError("an extras entry is out of range")
        return tuple((int(i), int(la)) for i, la in pairs)
    if not isinstance(value, (tuple, list)):
        raise LocalProtocolError(
            "extras must be a sequence of (iteration, layer)", value=type(value).__name__
        )
    check_count(len(value), "extras", "MAX_PARAM_EXTRAS", MAX_PARAM_EXTRAS)
    out = []
    for item in value:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise LocalProtocolError("an extras entry is (iteration, layer)", value=str(item)[:64])
        out.append(
            (
                check_uint(item[0], "extras iteration", MAX_COUNTER),
                check_uint(item[1], "extras layer", MAX_LAYER_ID),
            )
        )
    return tuple(out)


def _check_state(state: Any, lengths: tuple[int, ...]) -> None:
    check_uint(state, "state", MAX_STATE_PER_LAYER * MAX_PARAM_LAYERS)
    if lengths and state * (MAX_STATE_PER_LAYER + 1) > MAX_STATE_PER_LAYER * len(lengths):
        raise LocalProtocolError(
            f"more than {MAX_STATE_PER_LAYER} optimizer-state arrays per layer", value=(state, len(lengths))
        )


def _u64_buffer(values: Sequence[int] | Sequence[tuple[int, int]]) -> memoryview:
    return memoryview(np.asarray(values, dtype="<u8").reshape(-1).tobytes())


@dataclass(frozen=True, slots=True)
class ParamRequest(Message):
    """Ask for the job's parameters as of the end of iteration ``iteration`` − 1 (or a later snapshot).

    Trainer → its gateway: ``lengths`` are the dense lengths of the trainer's layers (its model passed the
    job's signature check, whose per-layer digests cover the shapes), so its gateway can bound what a peer
    sends, followed by ``state`` lengths of its optimizer's state arrays (:mod:`wanrt.kernels.state_transfer`;
    0 for a stateless optimizer). Gateway → gateway and gateway → the serving trainer: ``lengths`` is
    empty, ``state`` the number of state arrays the asking trainer can take (its optimizer's; a serving
    trainer whose own differ sends the parameters alone)."""

    TYPE: ClassVar[int] = MsgType.PARAM_REQUEST
    STREAM: ClassVar[bool] = True
    MAX_BUFFERS: ClassVar[int] = 1
    request: int
    iteration: int
    lengths: tuple[int, ...] = ()
    state: int = 0

    def __post_init__(self) -> None:
        check_uint(self.request, "request", MAX_COUNTER)
        check_uint(self.iteration, "iteration", MAX_COUNTER)
        object.__setattr__(self, "lengths", _lengths(self.lengths))
        _check_state(self.state, self.lengths)

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        header = {
            "request": self.request,
            "iteration": self.iteration,
            "lengths": len(self.lengths),
            "state": self.state,
        }
        return header, [_u64_buffer(self.lengths)]

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        return cls(**_counted(cls, header, buffers, ("lengths",)))


@dataclass(frozen=True, slots=True)
class ParamAnnounce(Message):
    """The answer's first frame: the snapshot holds every result of the iterations below ``iteration``
    (K) and, beyond them, exactly the results listed in ``extras``; its layers have ``lengths`` elements.
    The receiver checks all of it against its own model before it reserves room for one value."""

    TYPE: ClassVar[int] = MsgType.PARAM_ANNOUNCE
    STREAM: ClassVar[bool] = True
    MAX_BUFFERS: ClassVar[int] = 2
    request: int
    iteration: int
    lengths: tuple[int, ...]
    extras: tuple[tuple[int, int], ...] = ()
    #: the last ``state`` entries of ``lengths`` are optimizer-state arrays, not layers (0: parameters only)
    state: int = 0
    #: :func:`snapshot_checksum` of the values the chunks carry; the receiving trainer recomputes it before
    #: it swaps the snapshot in (empty: none given — a trainer refuses such a snapshot)
    checksum: bytes = b""

    def __post_init__(self) -> None:
        check_uint(self.request, "request", MAX_COUNTER)
        check_uint(self.iteration, "iteration", MAX_COUNTER)
        object.__setattr__(self, "lengths", _lengths(self.lengths))
        object.__setattr__(self, "extras", _extras(self.extras))
        _check_state(self.state, self.lengths)
        if not isinstance(self.checksum, bytes) or len(self.checksum) not in (0, CHECKSUM_BYTES):
            raise LocalProtocolError(
                f"a snapshot checksum is {CHECKSUM_BYTES} bytes", value=type(self.checksum).__name__
            )

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        header = {
            "request": self.request,
            "iteration": self.iteration,
            "lengths": len(self.lengths),
            "extras": len(self.extras),
            "state": self.state,
            "checksum": self.checksum,
        }
        return header, [_u64_buffer(self.lengths), _u64_buffer(self.extras)]

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        return cls(**_counted(cls, header, buffers, ("lengths", "extras")))


def _counted(
    cls: type[Message], header: dict[str, Any], buffers: Sequence[memoryview], names: tuple[str, ...]
) -> dict[str, Any]:
    """Header fields with the buffer-borne ones (``names``, in buffer order) decoded; counts must agree."""
    if set(header) != set(field_names(cls)):
        raise LocalProtocolError(f"{cls.__name__} header fields wrong", value=sorted(header)[:8])
    if len(buffers) != len(names):
        raise LocalProtocolError(f"{cls.__name__} carries {len(names)} buffers", value=len(buffers))
    fields = dict(header)
    for name, buf in zip(names, buffers, strict=True):
        n = check_uint(fields[name], name, MAX_COUNTER)
        per = 16 if name == "extras" else 8
        if memoryview(buf).nbytes != n * per:
            raise LocalProtocolError(f"{cls.__name__} {name} disagree with their count", value=n)
        fields[name] = bytes(buf)
    return fields


@dataclass(frozen=True, slots=True)
class ParamChunk(Message):
    """Values ``[offset, offset + len(values))`` of layer ``layer`` of the snapshot (fp32, finite)."""

    TYPE: ClassVar[int] = MsgType.PARAM_CHUNK
    STREAM: ClassVar[bool] = True
    MAX_BUFFERS: ClassVar[int] = 1
    request: int
    layer: int
    offset: int
    values: np.ndarray

    def __post_init__(self) -> None:
        check_uint(self.request, "request", MAX_COUNTER)
        check_uint(self.layer, "layer", MAX_LAYER_ID)
        check_uint(self.offset, "offset", MAX_LAYER_ELEMENTS)
        v = self.values
        if not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.ndim != 1:
            raise LocalProtocolError("chunk values must be a 1-d float32 array", value=type(v).__name__)
        if v.size == 0:
            raise LocalProtocolError("a chunk carries at least one value")
        check_count(v.size, "chunk values", "MAX_PARAM_CHUNK_ELEMENTS", MAX_PARAM_CHUNK_ELEMENTS)
        if self.offset + v.size > MAX_LAYER_ELEMENTS:
            raise LocalProtocolError("chunk ends past MAX_LAYER_ELEMENTS", value=self.offset + v.size)

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        header = {"request": self.request, "layer": self.layer, "offset": self.offset}
        data = np.ascontiguousarray(self.values, dtype="<f4").view(np.uint8)
        return header, [memoryview(data.data)]

    @classmethod
    def from_wire(cls, header: dict[str, Any], buffers: Sequence[memoryview], *, peer: str | None) -> Self:
        if set(header) != {"request", "layer", "offset"}:
            raise LocalProtocolError("ParamChunk header fields wrong", value=sorted(header)[:8])
        if len(buffers) != 1 or memoryview(buffers[0]).nbytes % 4:
            raise LocalProtocolError("ParamChunk carries one buffer of fp32 values")
        values = np.frombuffer(buffers[0], dtype="<f4")
        if values.size > MAX_PARAM_CHUNK_ELEMENTS:
            raise LocalProtocolError(
                "too many chunk values",
                name="MAX_PARAM_CHUNK_ELEMENTS",
                limit=MAX_PARAM_CHUNK_ELEMENTS,
                value=int(values.size),
            )
        # a copy: the frame buffer may be reused once this message is handed on (relayed hop by hop)
        return cls(values=values.astype(np.float32, copy=True), **header)

    def finite(self) -> bool:
        return bool(np.isfinite(self.values).all())


@dataclass(frozen=True, slots=True)
class ParamRefuse(Message):
    """Request ``request`` will not be answered (``reason``): the asker tries another peer or later."""

    TYPE: ClassVar[int] = MsgType.PARAM_REFUSE
    STREAM: ClassVar[bool] = True
    request: int
    reason: str

    def __post_init__(self) -> None:
        check_uint(self.request, "request", MAX_COUNTER)
        check_text(self.reason, "reason")


def snapshot_checksum(layers: Sequence[np.ndarray]) -> bytes:
    """BLAKE2b-128 over the snapshot's values, layer after layer, as little-endian fp32: computed by the
    serving trainer from the arrays it sends, and by the receiver from what it assembled, so a snapshot
    altered or mis-assembled anywhere on the way (a relay's bug, a chunk written at the wrong place) is
    never swapped in. The links are authenticated; this checks the end-to-end result, not the sender."""
    h = hashlib.blake2b(digest_size=CHECKSUM_BYTES)
    for a in layers:
        h.update(np.ascontiguousarray(a, dtype="<f4").reshape(-1).view(np.uint8).data)
    return h.digest()


#: Every parameter-resync message (what a link handler hands to the resync logic).
PARAM_MESSAGES: Final = (ParamRequest, ParamAnnounce, ParamChunk, ParamRefuse)
