"""Fuzz harness for the wire protocol: a corpus of valid sessions, mutators, and a checked runner.

Used by the CI fuzz tests (tests/wanrt/protocol/test_fuzz.py) and by ``tools/fuzz_protocol.py`` for long
runs. The robustness contract it checks, for every input fed to a fresh Connection:

* only messages, NEED_DATA, ConnectionClosed, or a :class:`ProtocolError` / :class:`AuthError` come out;
  any other exception is a bug (:class:`FuzzFailure`);
* ``next_event`` settles (returns NEED_DATA or ConnectionClosed, or raises) within a bounded number of calls;
* the frame buffer and the reassembly buffers never exceed the configured limits.

Recorded sessions use fixed nonces, so a fresh server drawing the same nonce accepts the recorded Auth: that
is what lets mutations reach the post-authentication decoders (payload codec, chunk reassembly). To reach
the decoders behind the CRC, some mutators re-checksum the frame they damaged.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgpack
import numpy as np

from wanrt.errors import AuthError, ProtocolError
from wanrt.payload import SparsePayload, fp32_to_bf16, n_blocks
from wanrt.protocol.chunks import split_frame
from wanrt.protocol.config import ProtocolConfig
from wanrt.protocol.connection import Connection
from wanrt.protocol.events import NEED_DATA, ConnectionClosed
from wanrt.protocol.frame import _FIXED, MAGIC
from wanrt.protocol.limits import FIXED_HEADER_BYTES, MAX_FRAME_BYTES
from wanrt.protocol.messages import (
    Ack,
    Aggregate,
    Bye,
    ChunkCancel,
    ConfigUpdate,
    Heartbeat,
    Hello,
    Message,
    MsgType,
    Push,
    Telemetry,
    Welcome,
)
from wanrt.protocol.states import State

__all__ = [
    "FUZZ_CONFIG",
    "FuzzFailure",
    "Input",
    "Session",
    "mutate",
    "record_session",
    "run_input",
]

FUZZ_SECRET: Final = b"fuzz-secret-0123456789abcdef"
FUZZ_JOB: Final = "fuzz-job"
#: Small limits, so that "nothing beyond the limits was allocated" is a tight, checkable statement.
FUZZ_CONFIG: Final = ProtocolConfig(
    max_frame_bytes=256 * 1024, max_partial_items=4, max_reassembly_bytes=512 * 1024
)

Target = Literal["server", "client"]


class FuzzFailure(AssertionError):
    """The protocol broke its robustness contract on an input (carries the input for reproduction)."""

    def __init__(self, message: str, data: bytes) -> None:
        super().__init__(message)
        self.data = data


def _fixed_nonce(seed: int) -> Callable[[int], bytes]:
    return lambda n: bytes([seed]) * n


def _connection(side: Target, config: ProtocolConfig) -> Connection:
    if side == "server":
        return Connection(
            "gateway", "gw", FUZZ_JOB, FUZZ_SECRET, side="server", config=config, nonce_source=_fixed_nonce(2)
        )
    return Connection(
        "trainer", "site-a", FUZZ_JOB, FUZZ_SECRET, side="client", config=config, nonce_source=_fixed_nonce(1)
    )


def fresh(target: Target, config: ProtocolConfig = FUZZ_CONFIG) -> Connection:
    """A connection on the ``target`` side, ready to receive the recorded peer's first frame."""
    conn = _connection(target, config)
    if target == "client":
        conn.hello(info=_CLIENT_INFO)
    return conn


_CLIENT_INFO: Final = {"model": "fuzz"}
_SERVER_INFO: Final = {"iteration": 3}


def _payload(rng: random.Random, layer: int) -> SparsePayload:
    bs = rng.choice((1, 4, 16))
    dense_len = rng.randrange(0, 3000)
    nb = n_blocks(dense_len, bs)
    k = rng.randrange(0, nb + 1)
    idx = np.array(sorted(rng.sample(range(nb), k)), dtype=np.int64)
    dense = np.random.default_rng(rng.randrange(2**32)).standard_normal(dense_len).astype(np.float32)
    p = SparsePayload.from_dense_blocks(layer, dense, idx, bs)
    dtype = rng.choice(("fp32", "fp16", "bf16"))
    if dtype == "fp16":
        return SparsePayload(layer, dense_len, bs, p.indices, p.values.astype(np.float16), "fp16")
    if dtype == "bf16":
        return SparsePayload(layer, dense_len, bs, p.indices, fp32_to_bf16(p.values), "bf16")
    return p


def _message(rng: random.Random, sender: str) -> Message:
    layer = rng.randrange(0, 50)
    kind = rng.randrange(6)
    if kind == 0:
        return Push(FUZZ_JOB, rng.randrange(100), layer, 0, sender, _payload(rng, layer))
    if kind == 1:
        return Aggregate(FUZZ_JOB, rng.randrange(100), layer, 1, sender, _payload(rng, layer), ("a", "b"))
    if kind == 2:
        return Ack(rng.randrange(100), layer, 0)
    if kind == 3:
        return Heartbeat(rng.randrange(1000), rng.random() * 1e4)
    if kind == 4:
        return Telemetry(sender, rng.randrange(100), {"idle": rng.random(), "mbps": rng.random() * 100})
    return ConfigUpdate(
        {"rate": rng.random(), "batch": rng.randrange(1, 256), "mode": "edf"}, rng.randrange(100)
    )


@dataclass(frozen=True)
class Session:
    """One recorded session: each side's frames, in order, as the other side received them."""

    client_frames: tuple[bytes, ...]
    server_frames: tuple[bytes, ...]

    def frames(self, target: Target) -> tuple[bytes, ...]:
        """What a fresh ``target`` connection receives: the other side's frames."""
        return self.client_frames if target == "server" else self.server_frames


def record_session(rng: random.Random) -> Session:
    """Run a valid session (handshake, pushes, chunked items, a cancel, control messages, Bye)."""
    client = _connection("client", FUZZ_CONFIG)
    server = _connection("server", FUZZ_CONFIG)
    client_frames = [client.hello(info=_CLIENT_INFO)]
    server.receive_data(client_frames[0])
    server.next_event()
    server_frames = [server.accept(info=_SERVER_INFO)]
    client.receive_data(server_frames[0])
    client.next_event()
    client_frames.append(client.authenticate())
    server.receive_data(client_frames[-1])
    server.next_event()
    for _ in range(rng.randrange(1, 6)):
        for conn, out, name in ((client, client_frames, "site-a"), (server, server_frames, "gw")):
            msg = _message(rng, name)
            if isinstance(msg, Push) and rng.random() < 0.4:
                item = rng.randrange(1000)
                # what a gateway's send queue does: frame once, cut the frame into Chunks
                size = rng.choice((1024, 2048, 8192))
                chunks = split_frame(conn.send_parts(msg), item_id=item, chunk_bytes=size)
                if len(chunks) > 1 and rng.random() < 0.3:
                    out.append(conn.send(chunks[0]))
                    out.append(conn.send(ChunkCancel(item)))
                else:
                    out.extend(conn.send(c) for c in chunks)
            else:
                out.append(conn.send(msg))
    if rng.random() < 0.5:
        client_frames.append(client.send(Bye("done")))
    return Session(tuple(client_frames), tuple(server_frames))


# ---------------------------------------------------------------------------------------------- mutators


def _refresh_crc(frame: bytearray) -> None:
    """Re-checksum a frame whose fixed header still parses, so damage reaches msgpack and the codec."""
    if len(frame) < FIXED_HEADER_BYTES:
        return
    crc = zlib.crc32(frame[FIXED_HEADER_BYTES:], zlib.crc32(frame[: FIXED_HEADER_BYTES - 4]))
    struct.pack_into("!I", frame, FIXED_HEADER_BYTES - 4, crc)


_HUGE: Final = (2**31, 2**32 - 1, MAX_FRAME_BYTES + 1, 2**31 - 1, 1 << 20)


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(12 if depth < 2 else 8)
    simple: list[Any] = [
        rng.randrange(-(2**63), 2**64),
        rng.choice((0, 1, -1, 2**32, 2**63 - 1, 2**64 - 1)),
        rng.random() * rng.choice((1, 1e300, -1)),
        rng.choice((float("nan"), float("inf"), -0.0)),
        "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(0, 20))),
        rng.randbytes(rng.randrange(0, 40)),
        rng.choice((True, False, None)),
        rng.choice(("fp32", "fp16", "bf16", "u32", "d16", "varint", "bitmap", "gateway", "")),
    ]
    if kind < 8:
        return simple[kind]
    if kind < 10:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    keys = ("fmt", "layer", "dense_len", "block_size", "dtype", "count", "index", "x")
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(0, 8))}


def _field_names(code: int) -> list[str]:
    from wanrt.protocol.registry import CORE_REGISTRY

    cls = CORE_REGISTRY.get(code)
    return [f.name for f in dataclasses.fields(cls)] if cls is not None else ["x"]


def _forged_frame(rng: random.Random, version: int = 1) -> bytes:
    """A well-checksummed frame of a random type whose header map is plausible but wrong in places."""
    code = rng.choice([int(t) for t in MsgType] + [0x40, 0xFF])
    names = _field_names(code)
    header: dict[str, Any] = {n: _random_value(rng) for n in names if rng.random() < 0.9}
    if "payload" in header and rng.random() < 0.7:
        header["payload"] = {
            "fmt": 1,
            "layer": rng.randrange(3),
            "dense_len": rng.choice((0, 1, 16, 1000, 2**40, -1)),
            "block_size": rng.choice((1, 16, 0, 2000)),
            "dtype": rng.choice(("fp32", "fp16", "bf16", "x")),
            "count": rng.choice((0, 1, 5, 2**31)),
            "index": rng.choice(("u32", "d16", "varint", "bitmap", "zz")),
        }
    buffers = [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(0, 3))]
    if buffers:
        header["_b"] = [len(b) for b in buffers] if rng.random() < 0.9 else [rng.randrange(300)]
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        packed = msgpack.packb({}, use_bin_type=True)
    pad = -(FIXED_HEADER_BYTES + len(packed)) % 8
    body = b"".join(buffers)
    frame = bytearray(_FIXED.pack(MAGIC, version, code, 0, pad, b"\0\0\0", len(packed), len(body), 0))
    frame += packed + bytes(pad) + body
    _refresh_crc(frame)
    return bytes(frame)


@dataclass(frozen=True)
class Input:
    """One fuzz case: which side receives it, the bytes, where to cut them, and how it was made."""

    target: Target
    data: bytes
    cuts: tuple[int, ...]
    mutator: str


def _cuts(rng: random.Random, n: int) -> tuple[int, ...]:
    mode = rng.randrange(4)
    if mode == 0 or n == 0:
        return ()
    if mode == 1 and n <= 4000:
        return tuple(range(1, n))  # byte by byte
    return tuple(sorted(rng.sample(range(1, n + 1), min(n, rng.randrange(1, 20)))))


def mutate(rng: random.Random, sessions: Sequence[Session]) -> Input:
    """Draw one fuzz input from the corpus (or from nothing)."""
    target: Target = "server" if rng.random() < 0.75 else "client"
    frames = [bytearray(f) for f in rng.choice(sessions).frames(target)]
    prefix = 2 if target == "server" else 1  # frames that complete the handshake
    kind = rng.randrange(10)
    name: str
    if kind == 0:
        name, data = "random_bytes", rng.randbytes(rng.randrange(0, 3000))
    elif kind == 1:
        name = "random_after_handshake"
        data = b"".join(frames[:prefix]) + rng.randbytes(rng.randrange(0, 3000))
    elif kind == 2:
        name = "bit_flips"
        flipped = bytearray(b"".join(frames))
        for _ in range(rng.randrange(1, 8)):
            pos = rng.randrange(len(flipped))
            flipped[pos] ^= 1 << rng.randrange(8)
        data = bytes(flipped)
    elif kind == 3:
        name = "truncated"
        blob = b"".join(frames)
        data = blob[: rng.randrange(len(blob) + 1)]
    elif kind == 4:
        name = "inflated_length"
        i = rng.randrange(len(frames))
        field_offset = rng.choice((12, 16))
        struct.pack_into("!I", frames[i], field_offset, rng.choice(_HUGE))
        if rng.random() < 0.5:
            _refresh_crc(frames[i])
        data = b"".join(frames)
    elif kind == 5:
        name = "frames_reordered"
        body = frames[prefix:]
        op = rng.randrange(3)
        if body and op == 0:
            body.pop(rng.randrange(len(body)))
        elif body and op == 1:
            j = rng.randrange(len(body))
            body.insert(j, body[j])
        elif len(body) > 1:
            a, b = rng.sample(range(len(body)), 2)
            body[a], body[b] = body[b], body[a]
        data = b"".join(frames[:prefix] + body)
    elif kind in (6, 7):
        name = "damaged_then_rechecksummed"
        # kind 6 may hit the handshake (forged proofs must fail authentication), kind 7 the stream
        lo = prefix if kind == 7 and len(frames) > prefix else 0
        i = rng.randrange(lo, len(frames))
        f = frames[i]
        for _ in range(rng.randrange(1, 6)):
            pos = rng.randrange(FIXED_HEADER_BYTES, len(f)) if len(f) > FIXED_HEADER_BYTES else 0
            f[pos] = rng.randrange(256)
        _refresh_crc(f)
        data = b"".join(frames)
    else:
        name = "forged_frames"
        forged = [_forged_frame(rng) for _ in range(rng.randrange(1, 4))]
        data = b"".join(frames[:prefix]) + b"".join(forged)
    return Input(target, data, _cuts(rng, len(data)), name)


# ------------------------------------------------------------------------------------------------ runner


def _check_bounds(conn: Connection, data: bytes) -> None:
    reader = conn._reader
    buf = reader._buf
    if buf is not None and len(buf) > conn.config.max_frame_bytes:
        raise FuzzFailure(f"frame buffer of {len(buf)} bytes exceeds the frame limit", data)
    if conn._reassembler is not None and conn._reassembler.reserved_bytes > conn.config.max_reassembly_bytes:
        raise FuzzFailure("reassembly exceeds its budget", data)


def _respond(conn: Connection, ev: object) -> None:
    """Play the application's part of the handshake, as a daemon would."""
    if isinstance(ev, Hello):
        conn.accept(info=_SERVER_INFO)
    elif isinstance(ev, Welcome):
        conn.authenticate()


def run_input(case: Input, config: ProtocolConfig = FUZZ_CONFIG) -> tuple[str, int]:
    """Feed one input to a fresh connection; return (outcome, messages seen). Raises FuzzFailure on a bug.

    Outcome is ``"need_data"`` (input exhausted mid-session), ``"closed"`` (EOF or session end reached) or the
    name of the ProtocolError/AuthError subclass the connection raised.
    """
    conn = fresh(case.target, config)
    bounds = (0, *case.cuts, len(case.data))
    messages = 0
    budget = len(case.data) + 10  # every event consumes at least one byte, except the final ones
    try:
        for lo, hi in itertools.pairwise(bounds):
            if hi > lo:
                conn.receive_data(case.data[lo:hi])
            for _ in range(budget):
                ev = conn.next_event()
                _check_bounds(conn, case.data)
                if ev is NEED_DATA:
                    break
                if isinstance(ev, ConnectionClosed):
                    return "closed", messages
                messages += 1
                _respond(conn, ev)
            else:
                raise FuzzFailure("next_event() did not settle", case.data)
        conn.receive_data(b"")
        for _ in range(budget):
            ev = conn.next_event()
            if isinstance(ev, ConnectionClosed):
                return "closed", messages
            if ev is NEED_DATA:
                raise FuzzFailure("NEED_DATA after EOF", case.data)
            messages += 1
        raise FuzzFailure("next_event() did not settle after EOF", case.data)
    except (ProtocolError, AuthError) as exc:
        if conn.state is not State.ERROR:
            raise FuzzFailure(
                f"{type(exc).__name__} raised but the connection is not in ERROR", case.data
            ) from exc
        if not conn.abort(exc):
            raise FuzzFailure("abort() produced no farewell frame after an error", case.data) from exc
        return type(exc).__name__, messages
    except FuzzFailure:
        raise
    except Exception as exc:
        raise FuzzFailure(f"unexpected {type(exc).__name__}: {exc}", case.data) from exc
