"""The gateway node's side of the timed probe trains: asking, answering and reporting (issue 25).

The decisions are :class:`~gateways.sending.probe_trains.ProbeTrains`' (sans-IO); this file only moves
them between the node's links and its telemetry, so that :mod:`gateways.node.node` calls three functions.
Trains are asked for only while the gateway reports to a scheduler: without one nothing reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateways.node.peer_channel import PeerChannel
from gateways.sending.probe_trains import ProbeTrains
from wanrt.protocol.peer.probe_train import PROBE_PRIORITY, ProbeRequest, ProbeTrain

__all__ = ["ask_for_trains", "on_probe_message", "probe_telemetry"]


def ask_for_trains(probes: ProbeTrains, links: Mapping[str, PeerChannel], now: float) -> None:
    """At a telemetry report: ask each live link's peer for the trains that are due."""
    for peer, ch in links.items():
        if ch.ended or ch.rx is None:
            continue
        due = probes.due(peer, ch.rx, now)
        if due is not None:
            ch.send_control(ProbeRequest(*due))


def on_probe_message(
    probes: ProbeTrains, ch: PeerChannel, msg: ProbeRequest | ProbeTrain, now: float
) -> None:
    """A peer asked for a train (answer it, within the sender's bound) or sent one (hand over its tail,
    which :meth:`PeerChannel.events` timed before handing the message out)."""
    if isinstance(msg, ProbeRequest):
        if probes.may_send(ch.peer, msg.nbytes, now):
            ch.send_bulk(ProbeTrain(msg.seq, msg.nbytes), PROBE_PRIORITY, paced=False)
        return
    rx = ch.rx
    probes.train(
        ch.peer,
        msg.seq,
        msg.nbytes,
        None if rx is None else rx.latest,
        rx is not None and rx.latest_fast,
        now,
    )


def probe_telemetry(probes: ProbeTrains, peer: str, m: dict[str, float], room: int) -> None:
    """``link.<peer>.probe_bytes|probe_s``: the timed trains' tails from ``peer`` (the peer → us
    direction), if any and if ``room`` keys are left in the report."""
    nbytes = probes.probe_bytes.get(peer)
    if nbytes is not None and room >= 2:
        m[f"link.{peer}.probe_bytes"] = float(nbytes)
        m[f"link.{peer}.probe_s"] = float(probes.probe_s.get(peer, 0.0))
