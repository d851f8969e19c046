"""Benchmark the byte movers against the obvious alternatives, side by side in one run.

1. Loopback TCP throughput: raw asyncio streams (``writelines`` + ``drain`` / ``read``) vs the same bytes
   through ``transports.connect``/``listen`` (StreamTransport). Also unix sockets and the in-memory pair
   for reference, each under stock asyncio and, when installed, uvloop. Ratio = wrapper / raw.
2. Shaped 100 Mbit/s goodput: ``ShapedTransport`` over a loopback TCP Transport vs a raw stream paced by the
   same :class:`TokenBucket` in a plain loop (same chunk and burst). Ratios vs that baseline and vs the
   configured rate; plus the shaped link with a 20 ms one-way delay.

Usage: python tools/bench_transports.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from transports import LinkShape, ShapedTransport, TokenBucket, Transport, connect, listen
from transports.memory import memory_pair
from transports.stream import READ_BUFFER_LIMIT, WRITE_HIGH_WATER

MSG = 1 << 20  # 1 MiB messages, sent as a 32-byte header + body (what the protocol's send_parts produces)
HEADER = b"h" * 32


async def _raw_stream_throughput(total: int, unix_path: str | None) -> float:
    """Seconds to move ``total`` bytes over bare asyncio streams (the baseline)."""
    done = asyncio.get_running_loop().create_future()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = 0
        while data := await reader.read(1 << 20):
            got += len(data)
        done.set_result(got)
        writer.close()

    if unix_path:
        server = await asyncio.start_unix_server(sink, unix_path, limit=READ_BUFFER_LIMIT)
        _, writer = await asyncio.open_unix_connection(unix_path, limit=READ_BUFFER_LIMIT)
    else:
        server = await asyncio.start_server(sink, "127.0.0.1", 0, limit=READ_BUFFER_LIMIT)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port, limit=READ_BUFFER_LIMIT)
    writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
    body = memoryview(bytearray(MSG - len(HEADER)))
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        writer.writelines([HEADER, body])
        await writer.drain()
        sent += MSG
    writer.close()
    got = await done
    elapsed = time.perf_counter() - t0
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    assert got == sent, (got, sent)
    return elapsed


async def _pump(t: Transport, total: int) -> None:
    body = memoryview(bytearray(MSG - len(HEADER)))
    sent = 0
    while sent < total:
        await t.send([HEADER, body])
        sent += MSG


async def _transport_throughput(total: int, url: str) -> float:
    """Seconds to move ``total`` bytes through connect()/listen() on ``url``."""
    done = asyncio.get_running_loop().create_future()

    async def sink(t: Transport) -> None:
        got = 0
        while data := await t.recv(1 << 20):
            got += len(data)
        done.set_result(got)

    lst = await listen(url, sink)
    t = await connect(lst.url)
    t0 = time.perf_counter()
    await _pump(t, total)
    await t.close()
    got = await done
    elapsed = time.perf_counter() - t0
    await lst.aclose()
    assert got >= total
    return elapsed


async def _memory_pair_throughput(total: int) -> float:
    a, b = memory_pair()

    async def sink() -> int:
        got = 0
        while data := await b.recv(1 << 20):
            got += len(data)
        return got

    reader = asyncio.create_task(sink())
    t0 = time.perf_counter()
    await _pump(a, total)
    await a.close()
    got = await reader
    assert got >= total
    return time.perf_counter() - t0


async def _paced_raw(total: int, rate: float, shape: LinkShape) -> float:
    """Baseline: bare asyncio stream paced chunk by chunk with the same token bucket, no delay line."""
    done = asyncio.get_running_loop().create_future()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = 0
        while data := await reader.read(1 << 20):
            got += len(data)
            if got >= total:
                done.set_result(time.perf_counter())
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    chunk = memoryview(bytearray(shape.chunk))
    bucket = TokenBucket(rate, shape.burst_for(rate), time.monotonic())
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        at = bucket.reserve(len(chunk), time.monotonic())
        wait = at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        writer.write(chunk)
        await writer.drain()
        sent += len(chunk)
    t_end = await done
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    return t_end - t0


async def _shaped(total: int, shape: LinkShape) -> float:
    """ShapedTransport over a loopback TCP transport; seconds from first send to last byte received."""
    done = asyncio.get_running_loop().create_future()

    async def sink(t: Transport) -> None:
        got = 0
        while data := await t.recv(1 << 20):
            got += len(data)
            if got >= total and not done.done():
                done.set_result(time.perf_counter())

    lst = await listen("tcp://127.0.0.1:0", sink)
    inner = await connect(lst.url)
    t = ShapedTransport(inner, shape)
    body = memoryview(bytearray(256 << 10))
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        await t.send([body])
        sent += len(body)
    t_end = await done
    await t.close()
    await lst.aclose()
    return t_end - t0


async def _side_by_side(
    base: Callable[[], Awaitable[float]], ours: Callable[[], Awaitable[float]], reps: int
) -> tuple[float, float]:
    """Median seconds of each, run alternately so background load hits both alike."""
    tb, to = [], []
    for _ in range(reps):
        tb.append(await base())
        to.append(await ours())
    return statistics.median(tb), statistics.median(to)


def _loops() -> list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]]:
    loops: list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]] = [("asyncio", asyncio.new_event_loop)]
    try:
        import uvloop

        loops.append(("uvloop", uvloop.new_event_loop))
    except ImportError:
        pass
    return loops


def run(quick: bool) -> dict[str, Any]:
    total = (64 if quick else 256) << 20
    reps = 3 if quick else 5
    rows: list[dict[str, Any]] = []
    tmp = Path("/tmp") / f"wanrt-bench-{time.time_ns()}.sock"

    for loop_name, factory in _loops():
        with asyncio.Runner(loop_factory=factory) as runner:
            for kind in ("tcp", "unix"):
                path = str(tmp) if kind == "unix" else None
                url = f"unix://{tmp}" if kind == "unix" else "tcp://127.0.0.1:0"
                raw, wrapped = runner.run(
                    _side_by_side(
                        lambda p=path: _raw_stream_throughput(total, p),  # type: ignore[misc]
                        lambda u=url: _transport_throughput(total, u),  # type: ignore[misc]
                        reps,
                    )
                )
                rows.append(
                    {
                        "case": f"{kind} loopback, {loop_name}",
                        "baseline": "raw asyncio streams",
                        "bytes": total,
                        "baseline_MBps": total / raw / 1e6,
                        "ours_MBps": total / wrapped / 1e6,
                        "ratio": raw / wrapped,
                    }
                )
            mem = statistics.median(runner.run(_memory_pair_throughput(total)) for _ in range(reps))
            rows.append(
                {
                    "case": f"memory_pair, {loop_name}",
                    "baseline": "-",
                    "bytes": total,
                    "baseline_MBps": None,
                    "ours_MBps": total / mem / 1e6,
                    "ratio": None,
                }
            )

    rate = 100e6
    shaped_total = (15 if quick else 40) << 20
    shape = LinkShape(rate_bps=rate)
    with asyncio.Runner() as runner:
        raw, ours = runner.run(
            _side_by_side(
                lambda: _paced_raw(shaped_total, rate, shape), lambda: _shaped(shaped_total, shape), 3
            )
        )
        delayed = runner.run(_shaped(shaped_total, LinkShape(rate_bps=rate, delay_s=0.02)))
    burst = shape.burst_for(rate)
    for name, secs, base in (
        ("shaped 100 Mbit/s", ours, raw),
        ("shaped 100 Mbit/s + 20 ms delay", delayed, raw),
    ):
        # the first `burst` bytes leave at once (same for both): steady-state goodput excludes them
        goodput = (shaped_total - burst) * 8 / secs
        rows.append(
            {
                "case": name,
                "baseline": "raw stream + same TokenBucket",
                "bytes": shaped_total,
                "baseline_MBps": shaped_total / base / 1e6,
                "ours_MBps": shaped_total / secs / 1e6,
                "ratio": base / secs,
                "goodput_bps": goodput,
                "vs_configured": goodput / rate,
            }
        )
    return {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "quick": quick,
        "rows": rows,
    }


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(result: dict[str, Any]) -> None:
    head = f"{'case':34} {'baseline':30} {'base MB/s':>10} {'ours MB/s':>10} {'ours/base':>9} {'vs rate':>8}"
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        base, ours = _fmt(r["baseline_MBps"], "10.1f"), _fmt(r["ours_MBps"], "10.1f")
        ratio, vs_rate = _fmt(r["ratio"], "9.3f"), _fmt(r.get("vs_configured"), "8.3f")
        print(f"{r['case']:34} {r['baseline']:30} {base:>10} {ours:>10} {ratio:>9} {vs_rate:>8}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller transfers (well under 60 s)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    result = run(args.quick)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
