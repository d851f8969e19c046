"""The evidence on a real transport: an emulated policed link (``ShapedTransport``, 30 Mbit/s, its 20 ms
burst, 20 ms one-way delay) carries 280 kB messages after idle gaps. The sender's view of a message (first
byte out to last byte in, less the propagation delay: what the ack-based delivery sample sees) reads the
burst as rate; the receiver's tail reads the link. Loose bounds (the event loop's timing, two shared cores);
nothing here reads the emulator's state."""

from __future__ import annotations

import asyncio
import time

from gateways.sending.rx_dispersion import RxDispersion
from transports import LinkShape, ShapedTransport, memory_pair

RATE = 30e6
SIZE = 280_000
DELAY = 0.02


async def test_the_tail_reads_the_policed_link_and_the_whole_message_reads_the_burst() -> None:
    a, b = memory_pair()
    shaped = ShapedTransport(a, LinkShape(rate_bps=RATE, delay_s=DELAY, jitter_s=0.001))
    rx = RxDispersion()
    sender_bps: list[float] = []
    for i in range(3):
        await asyncio.sleep(0.1)  # idle: the bucket refills its burst (75 kB at 30 Mbit/s)
        start = time.monotonic()
        await shaped.send([bytes(SIZE)])
        end = (i + 1) * SIZE
        while rx.total < end:
            data = await b.recv(1 << 18)
            rx.read(time.monotonic(), len(data))
        sender_bps.append(8.0 * SIZE / (time.monotonic() - DELAY - start))
        rx.message(end, SIZE)
    await shaped.close()
    assert rx.samples == 3
    tail_bps = 8.0 * rx.rx_bytes / rx.rx_s
    assert 0.85 * RATE <= tail_bps <= 1.15 * RATE, (tail_bps, sender_bps)
    assert min(sender_bps) > 1.15 * RATE, sender_bps  # ≈ 280 / 205 × 30 Mbit/s: the burst as rate
