#!/usr/bin/env python
"""Benchmark of the protocol's data path, side by side with the obvious alternatives, reported as ratios.

* receive: a 100 MB Push frame fed to a Connection in 64 KiB pieces (framing, CRC, msgpack header, codec
  decode) vs ``memcpy`` of the same pieces into a preallocated buffer (the memory-bandwidth floor) and vs
  msgpack with the values *inside* the map (join the pieces, then ``unpackb`` copies the bin out again);
* peak memory of that receive vs the frame plus the decoded int64 indices (target: one copy, <= 1.1);
* send: ``send_parts`` (codec encode + CRC, no copy of the values) vs ``memcpy`` and vs in-band msgpack;
* byte-by-byte feeding: cost per byte for a 1 KiB and an 8 KiB frame (target: ratio <= 1.5, i.e. no O(n^2));
* small messages: Ack round trips (send + receive) per second vs bare ``msgpack.packb``/``unpackb``.

Timings are the best of ``--reps`` (other processes load the machine); ratios travel between machines.

    python tools/bench_protocol.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from wanrt.payload import SparsePayload
from wanrt.protocol import Ack, Connection, Push

SECRET = b"bench-secret-0123456789abcdef"
PIECE = 64 * 1024


def _pair() -> tuple[Connection, Connection]:
    c = Connection("trainer", "site-a", "bench", SECRET, side="client")
    s = Connection("gateway", "gw", "bench", SECRET, side="server")
    s.receive_data(c.hello())
    s.next_event()
    c.receive_data(s.accept())
    c.next_event()
    s.receive_data(c.authenticate())
    s.next_event()
    return c, s


def _best(fn: Callable[[], Any], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _payload(value_bytes: int) -> SparsePayload:
    """Half of the 16-float blocks of a layer, ``value_bytes`` of fp32 values (StellaTrain-style COO)."""
    bs = 16
    nnz_blocks = value_bytes // (4 * bs)
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(2 * nnz_blocks, nnz_blocks, replace=False)).astype(np.int64)
    vals = rng.standard_normal(nnz_blocks * bs).astype(np.float32)
    return SparsePayload(0, 2 * nnz_blocks * bs, bs, idx, vals)


def bench_big(value_bytes: int, reps: int) -> dict[str, float]:
    client, _ = _pair()
    payload = _payload(value_bytes)
    push = Push("bench", 1, 0, 0, "site-a", payload)
    parts = client.send_parts(push)
    frame = b"".join(bytes(p) for p in parts)
    pieces = [frame[i : i + PIECE] for i in range(0, len(frame), PIECE)]
    n = len(frame)

    def receive() -> None:
        _, server = _pair()  # a handshake: microseconds against the 100 MB frame
        for p in pieces:
            server.receive_data(p)
        msg = server.next_event()
        assert isinstance(msg, Push) and msg.payload.nnz == payload.nnz

    def memcpy() -> None:
        buf = bytearray(n)
        view = memoryview(buf)
        pos = 0
        for p in pieces:
            view[pos : pos + len(p)] = p
            pos += len(p)

    inband = msgpack.packb({"values": payload.values.tobytes(), "indices": payload.indices.tobytes()})
    inband_pieces = [inband[i : i + PIECE] for i in range(0, len(inband), PIECE)]

    def msgpack_inband_receive() -> None:
        obj = msgpack.unpackb(b"".join(inband_pieces), max_bin_len=len(inband))
        np.frombuffer(obj["values"], np.float32)

    senders: list[Connection] = []

    def send() -> None:
        senders.pop().send_parts(push)

    def send_memcpy() -> None:
        bytearray(payload.values.data)  # one copy of the values: what a copying sender pays at least

    def msgpack_inband_send() -> None:
        msgpack.packb({"values": payload.values.tobytes(), "indices": payload.indices.tobytes()})

    receive()  # warm up (codec kernels, allocator)
    senders.extend(_pair()[0] for _ in range(reps))  # handshakes outside the timed region
    out = {
        "frame_bytes": float(n),
        "recv_connection_s": _best(receive, reps),
        "recv_memcpy_s": _best(memcpy, reps),
        "recv_msgpack_inband_s": _best(msgpack_inband_receive, reps),
        "send_parts_s": _best(send, reps),
        "send_memcpy_s": _best(send_memcpy, reps),
        "send_msgpack_inband_s": _best(msgpack_inband_send, reps),
    }
    _, server = _pair()
    tracemalloc.start()
    for p in pieces:
        server.receive_data(p)
    got = server.next_event()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert isinstance(got, Push)
    # the frame buffer is the one copy; the int64 block indices are the codec's necessary output
    out["recv_peak_over_frame"] = peak / n
    out["recv_peak_over_frame_plus_indices"] = peak / (n + got.payload.indices.nbytes)
    return out


def bench_bytewise(reps: int) -> dict[str, float]:
    """Per-byte cost of feeding one byte at a time; the sizes alternate within each repetition so that a
    change in machine load hits both alike."""
    frames = {}
    for size in (1024, 8192):
        client, _ = _pair()
        k = size // 8
        p = SparsePayload(0, size // 4, 1, np.arange(k, dtype=np.int64), np.ones(k, np.float32))
        frame = client.send(Push("bench", 1, 0, 0, "site-a", p))
        frames[size] = [frame[i : i + 1] for i in range(len(frame))]
    best = {size: float("inf") for size in frames}
    for _ in range(reps):
        for size, singles in frames.items():
            _, server = _pair()
            t = time.perf_counter()
            for b in singles:
                server.receive_data(b)
                server.next_event()
            best[size] = min(best[size], (time.perf_counter() - t) / len(singles))
    return {f"bytewise_{size}_us_per_byte": t * 1e6 for size, t in best.items()}


def bench_small(count: int, reps: int) -> dict[str, float]:
    client, server = _pair()
    acks = [Ack(i, i % 100, 0) for i in range(count)]

    def connection_round_trip() -> None:
        for a in acks:
            server.receive_data(client.send(a))
            server.next_event()

    dicts = [{"iteration": a.iteration, "layer": a.layer, "round": a.round} for a in acks]

    def bare_msgpack() -> None:
        for d in dicts:
            msgpack.unpackb(msgpack.packb(d))

    return {
        "ack_round_trips_per_s": count / _best(connection_round_trip, reps),
        "bare_msgpack_per_s": count / _best(bare_msgpack, reps),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 MB instead of 100 MB, fewer repetitions")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    value_bytes = (32 if args.quick else 100) * 1000 * 1000
    reps = 3 if args.quick else 5
    r: dict[str, float] = {}
    r.update(bench_big(value_bytes, reps))
    r.update(bench_bytewise(reps))
    r.update(bench_small(5_000 if args.quick else 20_000, reps))

    mb = r["frame_bytes"] / 1e6
    rows = [
        ("receive frame in 64 KiB pieces", r["recv_connection_s"], r["recv_memcpy_s"], "memcpy"),
        ("  msgpack in-band (baseline)", r["recv_msgpack_inband_s"], r["recv_memcpy_s"], "memcpy"),
        ("send_parts (encode + CRC)", r["send_parts_s"], r["send_memcpy_s"], "memcpy"),
        ("  msgpack in-band (baseline)", r["send_msgpack_inband_s"], r["send_memcpy_s"], "memcpy"),
    ]
    print(f"\nbench_protocol: {mb:.0f} MB Push frame, best of {reps}")
    print(f"{'case':34} {'seconds':>9} {'GB/s':>7} {'vs':>7} {'ratio':>7}")
    for name, t, base, vs in rows:
        print(f"{name:34} {t:9.4f} {r['frame_bytes'] / t / 1e9:7.2f} {vs:>7} {t / base:7.2f}x")
    print(
        f"{'receive peak / (frame + int64 idx)':34} {r['recv_peak_over_frame_plus_indices']:9.3f}   "
        f"target <= 1.10 (peak / frame alone: {r['recv_peak_over_frame']:.3f})"
    )
    bw = r["bytewise_8192_us_per_byte"] / r["bytewise_1024_us_per_byte"]
    print(
        f"{'byte-by-byte us/byte 1 KiB, 8 KiB':34} {r['bytewise_1024_us_per_byte']:9.2f} "
        f"{r['bytewise_8192_us_per_byte']:7.2f}   ratio {bw:.2f} (target <= 1.5: linear)"
    )
    small = r["ack_round_trips_per_s"] / r["bare_msgpack_per_s"]
    print(
        f"{'Ack send+receive per s':34} {r['ack_round_trips_per_s']:9.0f}   bare msgpack "
        f"{r['bare_msgpack_per_s']:.0f}/s, ratio {small:.2f}"
    )
    r["bytewise_ratio"] = bw
    r["recv_ratio_vs_memcpy"] = r["recv_connection_s"] / r["recv_memcpy_s"]
    r["inband_ratio_vs_connection"] = r["recv_msgpack_inband_s"] / r["recv_connection_s"]
    r["small_ratio_vs_bare_msgpack"] = small
    if args.json is not None:
        args.json.write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
