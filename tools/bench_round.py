"""One WAN round at the link limit: 3 sites in network namespaces, real gateway daemons, real trainers.

What runs (all real, nothing in-process): ``sims.netns`` builds 3 network namespaces joined pairwise by
veths (a full mesh), every direction shaped by a kernel ``tbf`` at ``--rate`` (100 Mbit/s). This kernel
has no ``netem``, so there is **no added delay**: the links are rate-limited only (sub-millisecond RTT).
Each namespace runs one ``wanrt gateway`` daemon (``python -m wanrt gateway --config ...``, a subprocess)
and one trainer (this file with ``--trainer``, a subprocess in the same namespace) that speaks the real
trainer protocol over the gateway's unix socket, pushes a payload when told to and timestamps the
aggregate's arrival. The parent times rounds: each round, all trainers push (iteration i) at once, and the
round time is the last aggregate's arrival minus the first push, on the one system-wide monotonic clock.

Rows: a 5 M-element fp32 tensor (``--elements``) exchanged dense in fp16, dense in fp32, and 1 % sparse
(16-float blocks, different blocks per site) in fp16 on the wire; topology ``allpairs``, and ``ring`` for
comparison. Median round time after ``--warmup`` rounds.

**Link limit**: the bytes each site must send divided by its links' rate, all N-1 links in parallel. For a
dense tensor of P bytes that is the all-reduce lower bound 2(N-1)/N·P bytes over N-1 links, i.e. each
directed link carries 2P/N: its slice of the receiver's segment and the sender's finished segment. For the
sparse row the same per-link bytes are computed from the actual payloads (each site's slice for the peer
plus the owner's finished segment, which is the union of the sites' blocks; values and the codec's index
bytes). The limit is a property of the network, so the ring row is compared with the same number (a ring
uses one of its N-1 links at a time, so it cannot get below (N-1)× the limit). TCP/IP and Ethernet headers
(~4 % at a 1500-byte MTU) are inside tbf's rate and outside the limit.

**Wire bytes**: from the gateways' own counters (``/status`` → ``counters.bytes_sent``, every frame written
to every peer link: round tags, payloads, chunk envelopes, acks, heartbeats), read by each trainer from its
namespace's gateway before and after the measured rounds; per site and round.

hivemind's DecentralizedAverager is run beside it only where ``import hivemind`` works (it is not a
dependency of the project); otherwise "hivemind not installed: skipped".

**Streamed push**: where the gateway offers its cut (all-pairs with cut-through), each trainer sends a dense
layer as ``PushPiece`` s in the gateway's forwarding order (``wanrt.protocol.push_pieces``), so its round
starts with the first piece; ``--push-whole`` sends one ``Push`` per layer instead (A/B runs). Each row
reports ``streamed_push``.

``--whole-results`` sets ``[gateway.rounds] stream_results = false`` (results go to the trainers whole, not
piece by piece as each is final; A/B runs). ``--chunk-bytes N`` sets ``[gateway.rounds]
allpairs_chunk_bytes`` (the all-pairs cut-through piece size; 0 = store-and-forward, for A/B runs in the
same conditions). ``--profile DIR`` runs each gateway under
cProfile (``python -m cProfile -o DIR/<topology>-<site>.prof``); ``--rows`` and ``--topologies`` select
what runs. Needs root (namespaces, tc); every namespace and process is removed on exit, also on an error or
Ctrl-C.

**Congestion control**: every gateway sets ``[gateway] tcp_congestion`` from ``--tcp-congestion`` (default
``cubic``, also on the raw-TCP baseline's sockets). These links have no propagation delay (no netem here), so
BBR, the default of some hosts (this machine's), measures a ~10 µs minimum RTT and its path model
under-paces dense rounds: 1.31-1.33x the limit against 1.09 with cubic (docs/round_bench.md, "Session 14").
Pinning cubic, the kernel's own default, keeps the result from depending on this host's sysctl;
``--tcp-congestion ''`` runs the host's default for A/B runs.

Usage: sudo python tools/bench_round.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: import this checkout, not whatever wanrt is installed
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gateways.rounds.aggregate import aggregate, segment_bounds, split_segments  # noqa: E402
from wanrt import codec  # noqa: E402
from wanrt.payload import SparsePayload, n_blocks  # noqa: E402

JOB = "bench-round"
BLOCK = 16
GATEWAY_PORT = 7700
RAW_PORT = 7800
METRICS_PORT = 9464
SITES = ("a", "b", "c")
#: Each round starts at one instant, this far ahead, at every trainer (the monotonic clock is system-wide):
#: far enough for every trainer to have read its command, so the push skew is a timer's, not a scheduler's.
START_LEAD_S = 0.02


@dataclass(frozen=True)
class Row:
    name: str
    density: float
    dtype: str
    layer: int


ROWS: tuple[Row, ...] = (
    Row("dense_fp16", 1.0, "fp16", 0),
    Row("dense_fp32", 1.0, "fp32", 1),
    Row("sparse_1pct_fp16", 0.01, "fp16", 2),
)


@dataclass(frozen=True)
class ClientRow:
    """A round through the public client (``--client``): ``elements`` fp32, fp16 on the wire."""

    name: str
    density: float
    elements: int
    #: the gateway row whose payloads give this row's link limit (the same bytes on the same links)
    like: Row


def client_rows(quick: bool) -> tuple[ClientRow, ...]:
    """Dense at 5 M and 25 M elements, 1 % at 5 M; ``--quick``: 1 M each, and no 25 M row (its key is
    full-run only: one 25 M round takes ~3 s at the link limit)."""
    dense, sparse = ROWS[0], ROWS[2]
    if quick:
        return (
            ClientRow("client_dense_fp16", 1.0, 1_000_000, dense),
            ClientRow("client_sparse_1pct_fp16", 0.01, 1_000_000, sparse),
        )
    return (
        ClientRow("client_dense_fp16", 1.0, 5_000_000, dense),
        ClientRow("client_dense_fp16_25m", 1.0, 25_000_000, dense),
        ClientRow("client_sparse_1pct_fp16", 0.01, 5_000_000, sparse),
    )


# -- payloads (the same function in the parent and in every trainer) ---------------------------------------


def make_payload(site: int, row: Row, elements: int) -> SparsePayload:
    """Site ``site``'s push for ``row``: standard-normal values; a sparse row picks its own random blocks."""
    rng = np.random.default_rng(1000 * row.layer + site)
    nb = n_blocks(elements, BLOCK)
    if row.density >= 1.0:
        idx = np.arange(nb, dtype=np.int64)
    else:
        k = max(1, round(row.density * nb))
        idx = np.sort(rng.choice(nb, size=k, replace=False)).astype(np.int64)
    values = rng.standard_normal(idx.shape[0] * BLOCK).astype(np.float32)
    if elements % BLOCK and int(idx[-1]) == nb - 1:
        values[(idx.shape[0] - 1) * BLOCK + elements % BLOCK :] = 0.0
    if row.dtype == "fp16":
        return SparsePayload(row.layer, elements, BLOCK, idx, values.astype(np.float16), "fp16")
    return SparsePayload(row.layer, elements, BLOCK, idx, values)


def encoded_bytes(p: SparsePayload, *, with_index: bool) -> int:
    """What the codec puts on the wire for ``p`` (values, plus the chosen index encoding if asked)."""
    _, buffers = codec.encode_payload(p)
    return len(memoryview(buffers[0]).cast("B")) + (
        len(memoryview(buffers[1]).cast("B")) if with_index else 0
    )


def link_limit_s(payloads: Sequence[SparsePayload], rate_bps: float) -> tuple[float, float, list[int]]:
    """(seconds, bytes per site, bytes per link in each phase) of the all-pairs lower bound, links in
    parallel: the slowest directed link decides. Two-hop: link p -> q carries p's slice of q's segment,
    then p's finished segment (the sum of every site's slice of it). A sparse exchange may instead send
    each contribution whole (one hop, link p -> q carries C_p): the smaller of the two counts. Dense: values
    only (the index is a 0.4 % bitmap)."""
    n = len(payloads)
    first = payloads[0]
    bounds = segment_bounds(n_blocks(first.dense_len, first.block_size), n)
    dense = all(p.nnz_blocks == n_blocks(p.dense_len, p.block_size) for p in payloads)
    slices = [split_segments(p, bounds, keep_dtype=True) for p in payloads]
    worst, per_site = 0.0, 0.0
    phases = [0, 0]
    for p in range(n):
        total = aggregate([slices[q][p] for q in range(n)])
        assert total is not None
        fin = total if first.value_dtype == "fp32" else _narrowed(total, first.value_dtype)
        fin_bytes = encoded_bytes(fin, with_index=not dense)
        parts = [encoded_bytes(slices[p][q], with_index=not dense) for q in range(n) if q != p]
        worst = max(worst, *(b + fin_bytes for b in parts))
        per_site = max(per_site, sum(b + fin_bytes for b in parts))
        phases = [max(phases[0], *parts), max(phases[1], fin_bytes)]
    if not dense:
        whole = [encoded_bytes(p, with_index=True) for p in payloads]
        if max(whole) < worst:
            worst, per_site, phases = max(whole), (n - 1) * max(whole), [max(whole)]
    return worst * 8 / rate_bps, per_site, phases


def _narrowed(p: SparsePayload, dtype: str) -> SparsePayload:
    from wanrt.codec.value_casts import in_wire_dtype

    return in_wire_dtype(p, dtype)


def expected_sum(payloads: Sequence[SparsePayload]) -> tuple[float, float]:
    """(Σ of the exact sum's values, Σ |values|): the reference a delivered aggregate is checked against."""
    total = sum(float(p.values_f32().astype(np.float64).sum()) for p in payloads)
    scale = sum(float(np.abs(p.values_f32().astype(np.float64)).sum()) for p in payloads)
    return total, scale


# -- the trainer (runs inside a namespace: --trainer) ------------------------------------------------------


async def trainer_main(url: str, site: str, index: int, secret: bytes, whole: bool = False) -> int:
    """Commands on stdin, one JSON object per line; one JSON reply per command on stdout."""
    from transports import connect
    from wanrt.client.link.result_streams import ResultStreams
    from wanrt.protocol import (
        NEED_DATA,
        Ack,
        Aggregate,
        AggregateEnd,
        AggregatePiece,
        Bye,
        Connection,
        ConnectionClosed,
        Error,
        Push,
        Welcome,
    )
    from wanrt.protocol.push_pieces import cut_push, push_cut_hint

    transport = await connect(url)
    conn = Connection("trainer", site, JOB, secret, side="client", peer=url)

    async def next_event() -> Any:
        while True:
            event = conn.next_event()
            if event is not NEED_DATA:
                return event
            data = await transport.recv()
            conn.receive_data(data)
            if not data:
                return conn.next_event()

    await transport.send([conn.hello({})])
    welcome = await next_event()
    if not isinstance(welcome, Welcome):
        raise RuntimeError(f"trainer {site}: no Welcome from its gateway")
    # the gateway's cut-through cut: pushes go in pieces in its forwarding order (a streamed push)
    hint = None if whole else push_cut_hint(welcome.info)
    await transport.send([conn.authenticate()])
    arrived: dict[tuple[int, int], tuple[float, Aggregate]] = {}
    changed = asyncio.Event()
    failed: list[str] = []
    # a dense result streamed piece by piece as it is final (wanrt.protocol.streamed_results), put together
    # as a real trainer does; the layers' lengths are set by "prepare"
    lengths: list[int] = []
    streams = [ResultStreams(lengths, peer=url)]

    async def reader() -> None:
        try:
            while True:
                event = await next_event()
                if isinstance(event, AggregatePiece):
                    streams[0].piece(event)
                    continue
                if isinstance(event, AggregateEnd):
                    whole = streams[0].end(event)
                    if whole is None:
                        raise RuntimeError(f"trainer {site}: a streamed result without its pieces")
                    p, e = whole, event
                    event = Aggregate(JOB, e.iteration, e.layer, e.round, e.sender, p, e.sites)
                if isinstance(event, Aggregate):
                    arrived[(event.iteration, event.layer)] = (time.monotonic(), event)
                    await transport.send(conn.send_parts(Ack(event.iteration, event.layer, event.round)))
                    changed.set()
                elif isinstance(event, (Bye, Error, ConnectionClosed)):
                    failed.append(repr(event))
                    changed.set()
                    return
        except Exception as exc:  # reported to the parent, which fails the run with it
            failed.append(repr(exc))
            changed.set()

    task = asyncio.get_running_loop().create_task(reader())
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    payloads: dict[int, SparsePayload] = {}
    last: Aggregate | None = None

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    raw = RawMesh()
    await raw.listen()
    reply({"event": "ready"})
    while line := await stdin.readline():
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "prepare":
            row = Row(cmd["name"], cmd["density"], cmd["dtype"], cmd["layer"])
            payloads[row.layer] = make_payload(index, row, cmd["elements"])
            lengths.extend([0] * (row.layer + 1 - len(lengths)))
            lengths[row.layer] = cmd["elements"]
            streams[0] = ResultStreams(lengths, peer=url)  # no round is in flight between rows
            p = payloads[row.layer]
            streamed = hint is not None and cut_push(JOB, 0, row.layer, site, p, hint) is not None
            reply({"event": "prepared", "streamed": streamed})
        elif op == "round":
            it, layer = cmd["iteration"], cmd["layer"]
            await asyncio.sleep(max(0.0, cmd["at"] - time.monotonic()))  # every site starts at once
            t0 = time.monotonic()
            cut = None if hint is None else cut_push(JOB, it, layer, site, payloads[layer], hint)
            if cut is None:
                await transport.send(conn.send_parts(Push(JOB, it, layer, 0, site, payloads[layer])))
            else:
                for piece in cut:  # one write per piece: the gateway decodes each as it arrives
                    await transport.send(conn.send_parts(piece))
            t_sent = time.monotonic()
            async with asyncio.timeout(cmd.get("timeout", 300.0)):
                while (it, layer) not in arrived:
                    if failed:
                        raise RuntimeError(f"trainer {site}: {failed[-1]}")
                    changed.clear()
                    await changed.wait()
            t1, last = arrived.pop((it, layer))
            reply({"event": "round", "t_push": t0, "t_sent": t_sent, "t_arrive": t1})
        elif op == "check":  # after every site's round ended: hashing 10 MB must not steal the round's CPU
            assert last is not None
            vals = last.payload.values_f32().astype(np.float64)
            digest = hashlib.blake2b(last.payload.values.tobytes(), digest_size=8)
            digest.update(last.payload.indices.tobytes())
            reply(
                {
                    "event": "check",
                    "sum": float(vals.sum()),
                    "nnz_blocks": last.payload.nnz_blocks,
                    "dtype": last.payload.value_dtype,
                    "digest": digest.hexdigest(),
                    "sites": list(last.sites),
                }
            )
        elif op == "raw_connect":
            await raw.connect(cmd["peers"], cmd.get("tcp_congestion", ""))
            reply({"event": "raw_connected"})
        elif op == "raw":
            await asyncio.sleep(max(0.0, cmd["at"] - time.monotonic()))
            t0 = time.monotonic()
            await raw.exchange(cmd["phases"])
            reply({"event": "raw", "t_start": t0, "t_end": time.monotonic()})
        elif op == "stats":
            status = await asyncio.to_thread(_http_json, f"http://127.0.0.1:{cmd['port']}/status")
            reply({"event": "stats", "counters": status["counters"], "engine": status.get("engine", {})})
        elif op == "quit":
            break
    await raw.close()
    with contextlib.suppress(Exception):
        await transport.send([conn.send(Bye("done"))])
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await transport.close()
    return 0


class RawMesh:
    """The baseline: plain asyncio TCP streams between the trainers' namespaces, over the same shaped links,
    moving the bytes a round must move in the same phases, with no framing, codec or round logic."""

    def __init__(self) -> None:
        self.received: list[int] = []  # per accepted peer connection, bytes so far
        self.done = 0  # bytes per connection counted by finished exchanges
        self.more = asyncio.Event()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.buf = memoryview(bytearray(1 << 16))

    async def listen(self) -> None:
        self.server = await asyncio.start_server(self._serve, "0.0.0.0", RAW_PORT)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        k = len(self.received)
        self.received.append(0)
        while data := await reader.read(1 << 20):
            self.received[k] += len(data)
            self.more.set()
        writer.close()

    async def connect(self, peers: list[str], tcp_congestion: str = "") -> None:
        """Dial every peer; the sockets run the gateways' congestion control (a like-for-like baseline)."""
        from transports.congestion import set_congestion

        for host in peers:
            _, w = await asyncio.open_connection(host, RAW_PORT)
            problem = set_congestion(w, tcp_congestion)
            if problem is not None:
                raise RuntimeError(f"raw TCP baseline: {problem}")
            self.writers.append(w)

    async def _send(self, w: asyncio.StreamWriter, n: int) -> None:
        while n > 0:
            k = min(n, len(self.buf))
            w.write(self.buf[:k])
            n -= k
            await w.drain()

    async def exchange(self, phases: list[int]) -> None:
        """Per phase: ``b`` bytes to every peer at once, then wait for ``b`` from every peer (a peer that
        started earlier may have sent some already: counts are per connection and cumulative)."""
        want = self.done
        for b in phases:
            await asyncio.gather(*(self._send(w, b) for w in self.writers))
            want += b
            while len(self.received) < len(self.writers) or min(self.received) < want:
                self.more.clear()
                await self.more.wait()
        self.done = want

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()


def _http_json(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


# -- the observed gateway (runs inside a namespace: --gateway, with --trace) --------------------------------


def gateway_main(config: str, ready_file: str, stats_file: str, trace_file: str) -> int:
    """``wanrt gateway``'s daemon class, unchanged, with the node's observation hooks timestamping every
    round-engine action and every round message handed to the engine (on the system-wide monotonic
    clock the trainers use): what ``--trace`` breaks a round down with."""
    from gateways.config import load_gateway_config
    from gateways.rounds.actions import Action, Deliver, Send
    from gateways.service.daemon import GatewayDaemon
    from transports import install_uvloop
    from transports.daemon_cli import write_json_atomically

    events: list[tuple[float, str, str, str, int]] = []

    def on_action(a: Action) -> None:
        if isinstance(a, Send):
            events.append((time.monotonic(), "send", a.msg.kind, a.peer, a.msg.iteration))
        elif isinstance(a, Deliver):
            events.append((time.monotonic(), "deliver", "final", "", a.iteration))

    def on_message(peer: str, m: Any) -> None:
        events.append((time.monotonic(), "recv", m.kind, peer, m.iteration))

    _trace_tcp_io(events)
    daemon = GatewayDaemon(load_gateway_config(config), on_action=on_action, on_message=on_message)
    install_uvloop()

    async def serve() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, daemon.request_stop)
        return await daemon.run(on_ready=lambda: write_json_atomically(Path(ready_file), daemon.ready_info()))

    stats = asyncio.run(serve())
    write_json_atomically(Path(stats_file), stats)
    Path(trace_file).write_text(json.dumps(events))
    return 0


#: ``struct tcp_info`` fields a trace keeps (Linux ``include/uapi/linux/tcp.h``): name -> (format, offset)
TCP_INFO_FIELDS: dict[str, tuple[str, int]] = {
    "unacked": ("I", 24),
    "rtt_us": ("I", 68),
    "cwnd": ("I", 80),
    "total_retrans": ("I", 100),
    "pacing_rate": ("Q", 104),  # bytes/s the kernel paces at (BBR: its bottleneck estimate x gain)
    "notsent_bytes": ("I", 144),
    "min_rtt_us": ("I", 148),
    "delivery_rate": ("Q", 160),
    "busy_us": ("Q", 168),  # time with data in flight
    "rwnd_limited_us": ("Q", 176),  # ... held back by the receiver's window
    "sndbuf_limited_us": ("Q", 184),  # ... by the send buffer
    "bytes_sent": ("Q", 200),
    "bytes_retrans": ("Q", 208),
}


def _tcp_info(transport: Any) -> dict[str, int]:
    """The link socket's TCP_INFO counters (empty where the kernel has none): whether a link that took
    longer than its bytes need was busy (the network) or idle with nothing written (the sender)."""
    import socket
    import struct

    sock = transport.get_extra_info("socket")
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 216)
    except (OSError, AttributeError):
        return {}
    if len(raw) < 216:
        return {}
    return {k: struct.unpack_from(f, raw, o)[0] for k, (f, o) in TCP_INFO_FIELDS.items()}


def _trace_tcp_io(events: list[Any]) -> None:
    """Timestamp every write and read on the WAN links (TCP; the trainer's unix socket is left out):
    ``(t, "tx", url, bytes, -1, seconds the write waited, TCP_INFO after it)`` and ``(t, "rx", url, bytes,
    -1, 0.0)`` (-1 where round events carry their iteration). A trace then shows per link whether bytes
    were handed to the kernel in time and whether the link was busy (docs/round_bench.md, "Session 14":
    how the pacer's bucket and the congestion control were found)."""
    from transports.stream import StreamTransport

    send, recv = StreamTransport.send, StreamTransport.recv

    async def traced_send(self: Any, parts: Any) -> None:
        t0 = time.monotonic()
        await send(self, parts)
        if self.peer.startswith("tcp"):
            waited = time.monotonic() - t0
            events.append((t0, "tx", self.peer, sum(map(len, parts)), -1, waited, _tcp_info(self)))

    async def traced_recv(self: Any, max_bytes: int = 1 << 20) -> bytes:
        data = await recv(self, max_bytes)
        if self.peer.startswith("tcp"):
            events.append((time.monotonic(), "rx", self.peer, len(data), -1, 0.0))
        return data

    StreamTransport.send = traced_send  # type: ignore[method-assign]
    StreamTransport.recv = traced_recv  # type: ignore[method-assign]


# -- processes in the namespaces ----------------------------------------------------------------------------


class Proc:
    """A subprocess started inside a namespace; stdout lines are JSON replies (trainers)."""

    def __init__(self, proc: asyncio.subprocess.Process, label: str, log: Path) -> None:
        self.proc, self.label, self.log = proc, label, log

    async def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
        await self.proc.stdin.drain()

    async def expect(self, event: str, timeout: float = 300.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while line := await self.proc.stdout.readline():
                msg: dict[str, Any] = json.loads(line)
                if msg.get("event") == event:
                    return msg
        rc = await self.proc.wait()
        raise RuntimeError(f"{self.label} exited ({rc}) before {event!r}; log: {self.tail()}")

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return "<no log>"

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Signal the process (by its own pid), wait, kill it if it does not exit in time."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                async with asyncio.timeout(timeout):
                    await self.proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def gateway_toml(
    site: str,
    emu: Any,
    sock_dir: Path,
    topology: str,
    secret_file: Path,
    rate_bps: float,
    direct: bool,
    chunk_bytes: int | None = None,
    rates: bool = False,
    stream_results: bool = True,
    tcp_congestion: str = "",
    pacer_burst_s: float | None = None,
) -> str:
    i = SITES.index(site)
    peers = "\n".join(
        f'{p} = "tcp://{emu.address(j, i)}:{GATEWAY_PORT}"' for j, p in enumerate(SITES) if p != site
    )
    # Every deadline is far beyond a measured round: a loaded 2-core machine must never make a gateway
    # skip a site or declare a peer lost mid-measurement.
    return f"""
[gateway]
site = "{site}"
job = "{JOB}"
secret_file = "{secret_file}"
listen = "tcp://0.0.0.0:{GATEWAY_PORT}"
trainer_listen = "unix://{sock_dir}/t{site}.sock"
metrics_port = {METRICS_PORT}
reconnect_initial_s = 0.05
reconnect_max_s = 0.5
shutdown_deadline_s = 5.0
link_rate_bps = {rate_bps}
tcp_congestion = "{tcp_congestion}"
{"" if pacer_burst_s is None else f"pacer_burst_s = {pacer_burst_s}"}

[gateway.peers]
{peers}

[gateway.rounds]
topology = "{topology}"
round_deadline_s = 120.0
t_w_s = 120.0
suspect_after_s = 120.0
allpairs_direct = {"true" if direct else "false"}
{"" if chunk_bytes is None else f"allpairs_chunk_bytes = {chunk_bytes}"}
stream_results = {"true" if stream_results else "false"}

[gateway.rates]
enabled = {"true" if rates else "false"}

[gateway.timeouts]
send = 120.0
heartbeat_interval = 5.0
heartbeat_misses = 12
"""


@dataclass
class Session:
    topology: str
    gateways: dict[str, Proc] = field(default_factory=dict)
    trainers: dict[str, Proc] = field(default_factory=dict)
    stats_files: dict[str, Path] = field(default_factory=dict)
    trace_files: dict[str, Path] = field(default_factory=dict)
    iteration: int = 0
    emu: Any = None
    allocator: dict[str, Any] = field(default_factory=dict)  # site -> /status "rates" + per-peer rates


@contextlib.asynccontextmanager
async def session(
    emu: Any,
    work: Path,
    topology: str,
    rate_bps: float,
    profile: Path | None,
    trace: Path | None = None,
    direct: bool = True,
    chunk_bytes: int | None = None,
    push_whole: bool = False,
    client: ClientRow | None = None,
    rates: bool = False,
    stream_results: bool = True,
    tcp_congestion: str = "",
    pacer_burst_s: float | None = None,
) -> AsyncIterator[Session]:
    """Gateways and trainers of one topology, up; stopped (gateways by SIGTERM: phased shutdown) on exit.
    With ``client`` the trainers are the public client (``tools/round_client.py``) training that row's
    model, and there is no raw-TCP mesh."""
    s = Session(topology, emu=emu)
    secret = work / "secret"
    secret.write_bytes(os.urandom(32).hex().encode())
    try:
        for site in SITES:
            i = SITES.index(site)
            cfg = work / f"{topology}-{site}.toml"
            cfg.write_text(
                gateway_toml(
                    site,
                    emu,
                    work,
                    topology,
                    secret,
                    rate_bps,
                    direct,
                    chunk_bytes,
                    rates,
                    stream_results,
                    tcp_congestion,
                    pacer_burst_s,
                )
            )
            ready = work / f"{topology}-{site}.ready"
            ready.unlink(missing_ok=True)
            s.stats_files[site] = work / f"{topology}-{site}.stats.json"
            argv = [sys.executable]
            if profile is not None:
                argv += ["-m", "cProfile", "-o", str(profile / f"{topology}-{site}.prof")]
            if trace is None:
                argv += ["-m", "wanrt", "gateway", "--config", str(cfg), "--ready-file", str(ready)]
                argv += ["--stats-file", str(s.stats_files[site]), "--log-level", "WARNING"]
            else:
                s.trace_files[site] = trace / f"{topology}-{site}.trace.json"
                argv += [str(Path(__file__).resolve()), "--gateway", str(cfg), "--ready-file", str(ready)]
                argv += ["--stats-file", str(s.stats_files[site]), "--trace-file", str(s.trace_files[site])]
            log = work / f"{topology}-{site}.gateway.log"
            with log.open("wb") as fh:
                proc = await asyncio.create_subprocess_exec(
                    *emu.exec_argv(i, argv), stdout=fh, stderr=fh, env=_env(), cwd=ROOT
                )
            s.gateways[site] = Proc(proc, f"gateway {site}", log)
        for site, g in s.gateways.items():
            ready = work / f"{topology}-{site}.ready"
            deadline = time.monotonic() + 60
            while not ready.exists():  # the daemon writes it atomically once listening
                if g.proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gateway {site} did not start: {g.tail()}")
                await asyncio.sleep(0.05)
        for site in SITES:
            i = SITES.index(site)
            mode = "--trainer" if client is None else "--client-trainer"
            argv = [sys.executable, str(Path(__file__).resolve()), mode, f"unix://{work}/t{site}.sock"]
            argv += ["--site", site, "--index", str(i), "--secret-file", str(secret)]
            argv += ["--push-whole"] if push_whole else []
            if client is not None:
                argv += ["--elements", str(client.elements), "--client-density", str(client.density)]
                argv += ["--client-work", str(work)]
            log = work / f"{topology}-{site}.trainer.log"
            with log.open("wb") as fh:
                proc = await asyncio.create_subprocess_exec(
                    *emu.exec_argv(i, argv),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=fh,
                    env=_env(),
                    cwd=ROOT,
                )
            s.trainers[site] = Proc(proc, f"trainer {site}", log)
        for t in s.trainers.values():
            await t.expect("ready", timeout=120)
        if client is None:
            for site, t in s.trainers.items():
                i = SITES.index(site)
                peers = [emu.address(j, i) for j in range(len(SITES)) if j != i]
                await t.send({"op": "raw_connect", "peers": peers, "tcp_congestion": tcp_congestion})
            for t in s.trainers.values():
                await t.expect("raw_connected", timeout=60)
        yield s
    finally:
        for t in s.trainers.values():
            with contextlib.suppress(Exception):
                await t.send({"op": "quit"})
        for t in s.trainers.values():
            await t.stop(signal.SIGTERM, timeout=10)
        for g in s.gateways.values():
            await g.stop(signal.SIGTERM, timeout=15)


async def one_round(s: Session, row: Row) -> dict[str, Any]:
    it = s.iteration
    s.iteration += 1
    at = time.monotonic() + START_LEAD_S
    await asyncio.gather(
        *(t.send({"op": "round", "iteration": it, "layer": row.layer, "at": at}) for t in s.trainers.values())
    )
    got = await asyncio.gather(*(t.expect("round") for t in s.trainers.values()))
    for t in s.trainers.values():
        await t.send({"op": "check"})
    checks = [await t.expect("check") for t in s.trainers.values()]
    return {
        "iteration": it,
        "t_push": {site: g["t_push"] for site, g in zip(s.trainers, got, strict=True)},
        "t_arrive": {site: g["t_arrive"] for site, g in zip(s.trainers, got, strict=True)},
        "seconds": max(g["t_arrive"] for g in got) - min(g["t_push"] for g in got),
        "push_skew": max(g["t_push"] for g in got) - min(g["t_push"] for g in got),
        "identical": len({c["digest"] for c in checks}) == 1,
        "sum": checks[0]["sum"],
        "dtype": checks[0]["dtype"],
        "sites": checks[0]["sites"],
    }


def cpu_seconds(s: Session) -> dict[str, float]:
    """CPU time (user + system) used so far by each gateway and trainer process (``/proc/<pid>/stat``;
    ``ip netns exec`` execs its command, so the pid is the Python process itself)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for role, procs in (("gateway", s.gateways), ("trainer", s.trainers)):
        for site, p in procs.items():
            try:
                fields = Path(f"/proc/{p.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[f"{role} {site}"] = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                out[f"{role} {site}"] = float("nan")
    return out


async def settle(s: Session, timeout: float = 90.0) -> float:
    """Wait until every gateway and trainer is idle (< 5 % of a core over half a second): the codec
    compiles its fused kernels in a background thread after the first large payload, which takes seconds
    of CPU in every process and must not land in timed rounds. Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        a = cpu_seconds(s)
        await asyncio.sleep(0.5)
        b = cpu_seconds(s)
        if all(b[k] - a[k] < 0.025 for k in a):
            break
    return time.monotonic() - t0


async def raw_round(s: Session, phases: list[int]) -> float:
    at = time.monotonic() + START_LEAD_S
    await asyncio.gather(*(t.send({"op": "raw", "phases": phases, "at": at}) for t in s.trainers.values()))
    got = [await t.expect("raw") for t in s.trainers.values()]
    return float(max(g["t_end"] for g in got) - min(g["t_start"] for g in got))


async def bytes_sent(s: Session) -> dict[str, int]:
    for t in s.trainers.values():
        await t.send({"op": "stats", "port": METRICS_PORT})
    out = {}
    for site, t in s.trainers.items():
        out[site] = int((await t.expect("stats"))["counters"]["bytes_sent"])
    return out


async def run_row(
    s: Session,
    row: Row,
    elements: int,
    warmup: int,
    measure: int,
    rate_bps: float,
    with_raw: bool,
    settle_s: float = 90.0,
) -> dict[str, Any]:
    for t in s.trainers.values():
        await t.send(
            {
                "op": "prepare",
                "name": row.name,
                "density": row.density,
                "dtype": row.dtype,
                "layer": row.layer,
                "elements": elements,
            }
        )
    streamed = [bool((await t.expect("prepared"))["streamed"]) for t in s.trainers.values()]
    payloads = [make_payload(i, row, elements) for i in range(len(SITES))]
    limit, ideal_bytes, phases = link_limit_s(payloads, rate_bps)
    ref, scale = expected_sum(payloads)
    for _ in range(warmup):
        await one_round(s, row)
    await settle(s, timeout=settle_s)
    raw = [await raw_round(s, phases) for _ in range(measure)] if with_raw else []
    before = await bytes_sent(s)
    cpu0 = cpu_seconds(s)
    rounds = [await one_round(s, row) for _ in range(measure)]
    cpu1 = cpu_seconds(s)
    after = await bytes_sent(s)
    await client_bytes_sent(s)  # fills s.allocator: what each gateway's rate allocator did
    cpu = {k: (cpu1[k] - cpu0[k]) / measure for k in cpu0}
    per_site = {site: (after[site] - before[site]) / measure for site in SITES}
    secs = [r["seconds"] for r in rounds]
    tol = 2e-3 * scale if row.dtype == "fp16" else 1e-5 * scale
    ok = all(r["identical"] and abs(r["sum"] - ref) <= tol and len(r["sites"]) == len(SITES) for r in rounds)
    median = statistics.median(secs)
    return {
        "topology": s.topology,
        "row": row.name,
        "elements": elements,
        "median_s": median,
        "streamed_push": all(streamed),
        "min_s": min(secs),
        "max_s": max(secs),
        "rounds_s": secs,
        "push_skew_s": max(r["push_skew"] for r in rounds),
        "link_limit_s": limit,
        "vs_link_limit": median / limit,
        "raw_tcp_s": statistics.median(raw) if raw else None,
        "raw_tcp_vs_link_limit": statistics.median(raw) / limit if raw else None,
        "vs_raw_tcp": median / statistics.median(raw) if raw else None,
        "wire_bytes_per_site": max(per_site.values()),
        "wire_bytes_per_site_by_site": per_site,
        "ideal_bytes_per_site": ideal_bytes,
        "wire_vs_ideal": max(per_site.values()) / ideal_bytes,
        "result_dtype": rounds[0]["dtype"],
        "cpu_s_per_round": cpu,  # includes the trainers' result checks (outside the timed span)
        "timeline": [{k: r[k] for k in ("iteration", "t_push", "t_arrive")} for r in rounds],
        "correct_and_identical": ok,
        "rate_allocator": dict(s.allocator),
    }


async def client_round(s: Session) -> dict[str, Any]:
    """Every site's ``backward(); opt.step()`` from one instant; the round is first start to last return."""
    at = time.monotonic() + START_LEAD_S
    await asyncio.gather(*(t.send({"op": "step", "at": at}) for t in s.trainers.values()))
    got = [await t.expect("step") for t in s.trainers.values()]
    stages = {k: statistics.fmean(g["stages"][k] for g in got) for k in got[0]["stages"]}
    return {
        "seconds": max(g["t_end"] for g in got) - min(g["t_start"] for g in got),
        "stages": stages,  # site-averaged
        "timeline": {
            site: {"t_start": g["t_start"], "t_end": g["t_end"], **g.get("marks", {})}
            for site, g in zip(s.trainers, got, strict=True)
        },
    }


async def run_client_row(
    s: Session, crow: ClientRow, warmup: int, measure: int, rate_bps: float, settle_s: float
) -> dict[str, Any]:
    payloads = [make_payload(i, crow.like, crow.elements) for i in range(len(SITES))]
    limit, ideal_bytes, _ = link_limit_s(payloads, rate_bps)
    for _ in range(warmup):
        await client_round(s)
    await settle(s, timeout=settle_s)
    before = await client_bytes_sent(s)
    cpu0 = cpu_seconds(s)
    rounds = [await client_round(s) for _ in range(measure)]
    cpu1 = cpu_seconds(s)
    after = await client_bytes_sent(s)
    for t in s.trainers.values():
        await t.send({"op": "check"})
    checks = [await t.expect("check") for t in s.trainers.values()]
    secs = [r["seconds"] for r in rounds]
    median = statistics.median(secs)
    stages = {k: statistics.median(r["stages"][k] for r in rounds) for k in rounds[0]["stages"]}
    per_site = {site: (after[site] - before[site]) / measure for site in SITES}
    return {
        "topology": s.topology,
        "row": crow.name,
        "elements": crow.elements,
        "density": crow.density,
        "median_s": median,
        "min_s": min(secs),
        "max_s": max(secs),
        "rounds_s": secs,
        "link_limit_s": limit,
        "vs_link_limit": median / limit,
        "wire_bytes_per_site": max(per_site.values()),
        "ideal_bytes_per_site": ideal_bytes,
        "wire_vs_ideal": max(per_site.values()) / ideal_bytes,
        "stages_s": stages,
        "stages_by_round_s": [r["stages"] for r in rounds],
        "timeline": [r["timeline"] for r in rounds],  # per round, per site: start, end, milestones
        "fused_codec": all(c["fused_codec"] for c in checks),
        "rate_allocator": dict(s.allocator),  # what each gateway's allocator did by the end of the row
        "cpu_s_per_round": {k: (cpu1[k] - cpu0[k]) / measure for k in cpu0},
        # every site applied the same updates: the parameters are bit-identical everywhere
        "correct_and_identical": len({c["digest"] for c in checks}) == 1,
    }


async def client_bytes_sent(s: Session) -> dict[str, int]:
    """Each gateway's peer-link bytes, read over HTTP from the parent (the client trainers only train)."""
    out = {}
    for site in s.gateways:
        i = SITES.index(site)
        argv = s.emu.exec_argv(i, [sys.executable, "-c", _STATS_SNIPPET, str(METRICS_PORT)])
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        data, _ = await proc.communicate()
        got = json.loads(data or b"{}")
        out[site] = int(got.get("bytes_sent", 0))
        s.allocator[site] = got.get("allocator", {})
    return out


_STATS_SNIPPET = (
    "import json, sys, urllib.request\n"
    "u = f'http://127.0.0.1:{sys.argv[1]}/status'\n"
    "st = json.loads(urllib.request.urlopen(u, timeout=10).read())\n"
    "peers = {p: {k: v.get(k) for k in ('rate_bps', 'base_rate_bps', 'straggler', 'last_link_time_s')}"
    " for p, v in st.get('peers', {}).items()}\n"
    "print(json.dumps({'bytes_sent': st['counters']['bytes_sent'],"
    " 'allocator': {**st.get('rates', {}), 'peers': peers}}))\n"
)


# -- main -----------------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, emu: Any, work: Path) -> list[dict[str, Any]]:
    rows = [r for r in ROWS if r.name in args.rows]
    out = []
    for topology in args.topologies:
        mine: list[dict[str, Any]] = []
        pace = args.pace_bps or args.rate
        t_start = time.monotonic()
        direct = not args.no_direct
        async with session(
            emu,
            work,
            topology,
            pace,
            args.profile,
            args.trace,
            direct,
            args.chunk_bytes,
            args.push_whole,
            rates=args.rates_on,
            stream_results=not args.whole_results,
            tcp_congestion=args.tcp_congestion,
            pacer_burst_s=args.pacer_burst_s,
        ) as s:
            print(f"  {topology}: gateways and trainers up in {time.monotonic() - t_start:.1f} s", flush=True)
            for row in rows:
                # sparse rounds take milliseconds and a loaded machine's noise is of that size: 3x as many
                measure = args.measure * (3 if row.density < 1 else 1)
                first = topology == args.topologies[0]
                settle_s = 10.0 if args.quick else 90.0  # --quick must stay under a minute
                res = await run_row(s, row, args.elements, args.warmup, measure, args.rate, first, settle_s)
                out.append(res)
                mine.append(res)
                print(
                    f"  {topology:9s} {row.name:17s} median {res['median_s']:.3f} s  "
                    f"limit {res['link_limit_s']:.3f} s  x{res['vs_link_limit']:.2f}  "
                    f"wire {res['wire_vs_ideal']:.3f}x ideal  ok={res['correct_and_identical']}  "
                    f"streamed push={res['streamed_push']}",
                    flush=True,
                )
                cpu = res["cpu_s_per_round"]
                print("    cpu s/round: " + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items()), flush=True)
        if s.trace_files and topology == "allpairs":  # written by the gateways as they stopped
            traces = {site: json.loads(f.read_text()) for site, f in s.trace_files.items()}
            for res in mine:
                res["breakdown_s"] = breakdown(res, traces)
                phases = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in res["breakdown_s"].items())
                print(f"  {res['row']}: {phases}", flush=True)
    crows = [c for c in client_rows(args.quick) if args.client_rows is None or c.name in args.client_rows]
    for crow in crows if args.client else ():
        t_start = time.monotonic()
        prof = None if args.profile is None else args.profile / crow.name
        trace = None if args.trace is None else args.trace / crow.name
        for d in (prof, trace):
            if d is not None:
                d.mkdir(parents=True, exist_ok=True)
        async with session(
            emu,
            work,
            "allpairs",
            args.pace_bps or args.rate,
            prof,
            trace,
            not args.no_direct,
            args.chunk_bytes,
            client=crow,
            rates=args.rates_on,
            stream_results=not args.whole_results,
            tcp_congestion=args.tcp_congestion,
            pacer_burst_s=args.pacer_burst_s,
        ) as s:
            print(
                f"  {crow.name}: gateways and client trainers up in {time.monotonic() - t_start:.1f} s",
                flush=True,
            )
            measure = max(6, args.measure) * (3 if crow.density < 1 else 1)
            warmup = max(2, args.warmup)
            res = await run_client_row(s, crow, warmup, measure, args.rate, 10.0 if args.quick else 60.0)
        out.append(res)
        print(
            f"  {'client':9s} {crow.name:17s} median {res['median_s']:.3f} s  "
            f"limit {res['link_limit_s']:.3f} s  x{res['vs_link_limit']:.2f}  "
            f"ok={res['correct_and_identical']}",
            flush=True,
        )
        print(
            "    stages ms: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in res["stages_s"].items()),
            flush=True,
        )
    return out


#: Phases of a two-hop all-pairs round at one site, between the marks ``breakdown`` reads from the traces.
PHASES = (
    ("push in", "trainer push -> its gateway sends the first part"),
    ("reduce-scatter", "first part sent -> the last part (piece) for its own segment received"),
    ("reduce", "last part received -> its (last) finished piece sent"),
    (
        "all-gather",
        "last finished piece sent -> the last finished piece received (with cut-through the"
        " all-gather of earlier pieces overlaps the reduce-scatter: this is its tail)",
    ),
    ("assemble", "last finished segment received -> result delivered to the node"),
    ("deliver out", "result delivered -> the trainer has the Aggregate"),
)
#: ... and of a direct (one-hop) round: every contribution whole to every member, each member sums.
DIRECT_PHASES = (
    ("push in", "trainer push -> its gateway sends its contribution"),
    ("exchange", "contribution sent -> the last member's contribution received"),
    ("sum", "last contribution received -> result delivered to the node"),
    ("deliver out", "result delivered -> the trainer has the Aggregate"),
)


def _site_marks(events: list[list[Any]], it: int) -> tuple[tuple[tuple[str, str], ...], list[float]] | None:
    mine = [e for e in events if e[4] == it]

    def at(what: str, kind: str, pick: Any) -> float:
        return float(pick(e[0] for e in mine if e[1] == what and e[2] == kind))

    try:
        if any(e[1] == "send" and e[2] == "segment_final" for e in mine):
            return PHASES, [
                at("send", "segment", min),
                at("recv", "segment", max),
                at("send", "segment_final", max),
                at("recv", "segment_final", max),
                at("deliver", "final", min),
            ]
        return DIRECT_PHASES, [
            at("send", "segment", min),
            at("recv", "segment", max),
            at("deliver", "final", min),
        ]
    except ValueError:  # an event is missing (not an all-pairs round): no breakdown
        return None


def breakdown(row: dict[str, Any], traces: dict[str, list[list[Any]]]) -> dict[str, float]:
    """Median over rounds of the site-averaged phase durations (PHASES or DIRECT_PHASES), from the traces."""
    per_phase: dict[str, list[float]] = {}
    for rnd in row["timeline"]:
        sums: dict[str, float] = {}
        for site, events in traces.items():
            got = _site_marks(events, rnd["iteration"])
            if got is None:
                return {}
            phases, marks = got
            marks = [rnd["t_push"][site], *marks, rnd["t_arrive"][site]]
            for (name, _), a, b in zip(phases, marks, marks[1:], strict=False):
                sums[name] = sums.get(name, 0.0) + (b - a) / len(traces)
        for name, v in sums.items():
            per_phase.setdefault(name, []).append(v)
    return {name: statistics.median(v) for name, v in per_phase.items()}


def hivemind_arm() -> str:
    if importlib.util.find_spec("hivemind") is None:
        return "hivemind not installed: skipped"
    return "hivemind installed, but its DecentralizedAverager arm is not implemented here: skipped"


def table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'topology':9s} {'row':17s} {'median s':>9s} {'min s':>7s} {'limit s':>8s} {'x limit':>8s} "
        f"{'raw TCP s':>9s} {'raw x lim':>9s} {'x raw':>6s} {'wire MB/site':>12s} {'x ideal':>8s} {'ok':>3s}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        raw = r.get("raw_tcp_s")
        raw_cols = (
            f"{raw:9.3f} {r['raw_tcp_vs_link_limit']:9.2f} {r['vs_raw_tcp']:6.2f}"
            if raw is not None
            else f"{'':9s} {'':9s} {'':6s}"
        )
        lines.append(
            f"{r['topology']:9s} {r['row']:17s} {r['median_s']:9.3f} {r['min_s']:7.3f} "
            f"{r['link_limit_s']:8.3f} {r['vs_link_limit']:8.2f} {raw_cols} "
            f"{r['wire_bytes_per_site'] / 1e6:12.2f} {r['wire_vs_ideal']:8.3f} "
            f"{'yes' if r['correct_and_identical'] else 'NO':>3s}"
        )
    return "\n".join(lines)


def keys(results: list[dict[str, Any]], elements: int) -> dict[str, Any]:
    by = {(r["topology"], r["row"]): r for r in results}
    out: dict[str, Any] = {}
    fp16 = by.get(("allpairs", "dense_fp16"))
    if fp16 is not None:
        n = len(SITES)
        out["dense_fp16_vs_link_limit"] = fp16["vs_link_limit"]
        out["dense_fp16_wire_bytes_per_site"] = fp16["wire_bytes_per_site"]
        out["dense_fp16_wire_bytes_vs_ideal"] = fp16["wire_bytes_per_site"] / (2 * (n - 1) / n * elements * 2)
        ring = by.get(("ring", "dense_fp16"))
        if ring is not None:
            out["dense_fp16_ring_vs_allpairs"] = ring["median_s"] / fp16["median_s"]
    sparse = by.get(("allpairs", "sparse_1pct_fp16"))
    if sparse is not None:
        out["sparse_round_vs_link_limit"] = sparse["vs_link_limit"]
        out["sparse_round_s"] = sparse["median_s"]
    fp32 = by.get(("allpairs", "dense_fp32"))
    if fp32 is not None:
        out["dense_fp32_vs_link_limit"] = fp32["vs_link_limit"]
    return out


def client_table(results: list[dict[str, Any]]) -> str:
    """The client rows: round against the limit, then the trainer's time by stage (site-averaged medians,
    ms per round; stages in the link and worker threads overlap the training thread's)."""
    from round_client import STAGE_ORDER

    cols = [*STAGE_ORDER, "backward", "step"]
    head = f"{'row':24s} {'median s':>9s} {'limit s':>8s} {'x limit':>8s} {'ok':>3s}  " + " ".join(
        f"{c:>9s}" for c in cols
    )
    lines = [head, "-" * len(head)]
    for r in results:
        st = r["stages_s"]
        lines.append(
            f"{r['row']:24s} {r['median_s']:9.3f} {r['link_limit_s']:8.3f} {r['vs_link_limit']:8.2f} "
            f"{'yes' if r['correct_and_identical'] else 'NO':>3s}  "
            + " ".join(f"{st.get(c, float('nan')) * 1e3:9.1f}" for c in cols)
        )
    return "\n".join(lines)


def merged(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (topology, row) over the ``--repeat`` repetitions: the median of their medians (and
    of their stage times); the other fields are the last repetition's."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["topology"], r["row"]), []).append(r)
    out = []
    for reps in groups.values():
        row = dict(reps[-1])
        if len(reps) > 1:
            row["rep_medians_s"] = [r["median_s"] for r in reps]
            row["median_s"] = statistics.median(row["rep_medians_s"])
            row["vs_link_limit"] = row["median_s"] / row["link_limit_s"]
            row["correct_and_identical"] = all(r["correct_and_identical"] for r in reps)
            if "stages_s" in row:
                row["stages_s"] = {
                    k: statistics.median(r["stages_s"][k] for r in reps) for k in row["stages_s"]
                }
        out.append(row)
    return out


def paired_ratios(results: list[dict[str, Any]]) -> list[float]:
    """Client dense round over the gateway dense round of the same repetition (same elements)."""
    out = []
    for rep in sorted({r.get("rep", 0) for r in results}):
        by = {r["row"]: r for r in results if r.get("rep", 0) == rep and r["topology"] == "allpairs"}
        gw, cl = by.get("dense_fp16"), by.get("client_dense_fp16")
        if gw is not None and cl is not None and gw["elements"] == cl["elements"]:
            out.append(cl["median_s"] / gw["median_s"])
    return out


def client_keys(results: list[dict[str, Any]], quick: bool) -> dict[str, Any]:
    """The client's keys; the gateway round beside it is the dense fp16 all-pairs row of the same run."""
    by = {r["row"]: r for r in results if r["topology"] == "allpairs"}
    out: dict[str, Any] = {}
    dense = by.get("client_dense_fp16")
    if dense is not None:
        out["client_dense_fp16_vs_link_limit"] = dense["vs_link_limit"]
        gw = by.get("dense_fp16")
        if gw is not None and gw["elements"] == dense["elements"]:
            out["client_over_gateway_round"] = dense["median_s"] / gw["median_s"]
    big = by.get("client_dense_fp16_25m")
    if big is not None:
        out["client_dense_fp16_vs_link_limit_25m"] = big["vs_link_limit"]
    elif quick:
        out["client_dense_fp16_vs_link_limit_25m"] = "full run only (25 M elements)"
    sparse = by.get("client_sparse_1pct_fp16")
    if sparse is not None:
        out["client_sparse_round_vs_link_limit"] = sparse["vs_link_limit"]
        out["client_sparse_round_s"] = sparse["median_s"]
    out["client_stages_ms"] = {
        r["row"]: {k: v * 1e3 for k, v in r["stages_s"].items()} for r in results if "stages_s" in r
    }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 M elements, fewer rounds (< 60 s)")
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--elements", type=int, help="tensor length (default 5 M, --quick 1 M)")
    ap.add_argument("--warmup", type=int, help="rounds skipped per row (default 2, --quick 1)")
    ap.add_argument(
        "--measure",
        type=int,
        help="rounds timed per dense row, 3x that per sparse row (default 7, --quick 3)",
    )
    ap.add_argument("--rate", type=float, default=100e6, help="tbf rate of every direction, bit/s")
    ap.add_argument(
        "--pace-bps", type=float, help="the gateways' link_rate_bps (their own pacing; default: --rate)"
    )
    ap.add_argument("--topologies", nargs="+", default=["allpairs", "ring"])
    ap.add_argument(
        "--no-direct", action="store_true", help="all-pairs always two-hop ([gateway.rounds] allpairs_direct)"
    )
    ap.add_argument(
        "--chunk-bytes",
        type=int,
        help="[gateway.rounds] allpairs_chunk_bytes: cut-through piece size (0: off; default: the gateway's)",
    )
    ap.add_argument("--rows", nargs="+", default=[r.name for r in ROWS], choices=[r.name for r in ROWS])
    ap.add_argument("--profile", type=Path, help="run each gateway under cProfile, .prof files here")
    # the trainer subprocess (internal)
    ap.add_argument(
        "--trace", type=Path, help="run the gateways with timestamped round events; a breakdown per row"
    )
    ap.add_argument(
        "--push-whole",
        action="store_true",
        help="trainers push every layer as one Push (no streamed push in pieces; for A/B runs)",
    )
    ap.add_argument(
        "--client",
        action="store_true",
        help="also time rounds through the public client (wanrt.init + SparseOptimizer, backward + step)",
    )
    ap.add_argument(
        "--client-rows",
        nargs="+",
        choices=[c.name for c in client_rows(False)],
        help="with --client: only these client rows (default all)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run everything this many times in turn (gateway rows, then client rows); keys use the "
        "median over the repetitions, client_over_gateway_round the median of the paired ratios",
    )
    ap.add_argument(
        "--whole-results",
        action="store_true",
        help="[gateway.rounds] stream_results = false: results go to the trainers whole (for A/B runs)",
    )
    ap.add_argument(
        "--rates-on",
        action="store_true",
        help="[gateway.rates] enabled = true: the straggler rate allocator paces the links (default off)",
    )
    ap.add_argument(
        "--tcp-congestion",
        default="cubic",
        help="[gateway] tcp_congestion of the gateways and of the raw-TCP baseline's sockets (default cubic: "
        "these links have no propagation delay, where BBR's path model degenerates; '' = the host's default)",
    )
    ap.add_argument(
        "--pacer-burst-s",
        type=float,
        help="[gateway] pacer_burst_s of every gateway (default: the gateway's own; for A/B runs)",
    )
    ap.add_argument("--trainer", help=argparse.SUPPRESS)
    ap.add_argument("--client-trainer", help=argparse.SUPPRESS)
    ap.add_argument("--client-density", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--client-work", help=argparse.SUPPRESS)
    ap.add_argument("--gateway", help=argparse.SUPPRESS)
    ap.add_argument("--ready-file", help=argparse.SUPPRESS)
    ap.add_argument("--stats-file", help=argparse.SUPPRESS)
    ap.add_argument("--trace-file", help=argparse.SUPPRESS)
    ap.add_argument("--site", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--secret-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.gateway:
        return gateway_main(args.gateway, args.ready_file, args.stats_file, args.trace_file)
    if args.client_trainer:
        from round_client import run as run_client

        return run_client(
            args.client_trainer,
            args.site,
            args.secret_file,
            args.elements,
            args.client_density,
            "fp16",
            args.client_work,
        )
    if args.trainer:
        secret = Path(args.secret_file).read_bytes().strip()
        return asyncio.run(trainer_main(args.trainer, args.site, args.index, secret, args.push_whole))
    args.elements = args.elements or (1_000_000 if args.quick else 5_000_000)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.measure = args.measure or (3 if args.quick else 7)
    for d in (args.profile, args.trace):
        if d is not None:
            d.mkdir(parents=True, exist_ok=True)

    from sims.netns import Emulation, Shape, cleanup_stale, probe

    reason = probe().skip_reason()
    if reason is not None:
        print(f"cannot emulate the WAN here: {reason}", file=sys.stderr)
        return 2
    cleanup_stale()
    netem = probe().netem
    print(
        f"3 sites, full mesh of veths, tbf {args.rate / 1e6:g} Mbit/s per direction, "
        f"{'netem present (no delay configured)' if netem else 'no netem on this kernel: no added delay'}; "
        f"{args.elements:,} elements, {args.warmup} warm-up + {args.measure} timed rounds per row; "
        f"TCP congestion control {args.tcp_congestion or 'the host default'} on the gateways' links",
        flush=True,
    )
    t0 = time.monotonic()

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}: cleaning up")  # unwinds through every finally and with-exit

    signal.signal(signal.SIGTERM, terminated)
    keep = os.environ.get("WANRT_BENCH_KEEP")  # a directory: configs, logs and traces stay there
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
    tmp_ctx: Any = contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory(prefix="wbr")
    with tmp_ctx as tmp, Emulation(len(SITES), shape=Shape(rate_bps=args.rate)) as emu:
        results = []
        for rep in range(args.repeat):  # gateway rows, then client rows, again: load drifts hit both
            for res in asyncio.run(bench(args, emu, Path(tmp))):
                res["rep"] = rep
                results.append(res)
    hm = hivemind_arm()
    raw_results = results
    results = merged(results)
    gw_rows = [r for r in results if "stages_s" not in r]
    cl_rows = [r for r in results if "stages_s" in r]
    print()
    print(table(gw_rows))
    if cl_rows:
        print()
        print(client_table(cl_rows))
    print(hm)
    k = keys(gw_rows, args.elements)
    if cl_rows:
        k.update(client_keys(results, args.quick))
        ratios = paired_ratios(raw_results)
        if ratios:
            k["client_over_gateway_round"] = statistics.median(ratios)
            k["client_over_gateway_round_by_rep"] = ratios
    for name, value in k.items():
        if isinstance(value, float):
            print(f"{name} = {value:.4g}")
        elif not isinstance(value, dict):
            print(f"{name}: {value}")
    if args.json:
        doc = {
            "config": {
                "sites": len(SITES),
                "elements": args.elements,
                "rate_bps": args.rate,
                "warmup": args.warmup,
                "measure": args.measure,
                "netem": netem,
                "delay_s": 0.0,
                "quick": args.quick,
                "wall_s": time.monotonic() - t0,
            },
            "rows": results,
            "rows_by_rep": raw_results if args.repeat > 1 else None,
            "hivemind": hm,
            "rate_allocator_enabled": args.rates_on,
            "stream_results": not args.whole_results,
            "tcp_congestion": args.tcp_congestion or "host default",
            "pacer_burst_s": args.pacer_burst_s,  # None: the gateway's default
            **k,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
