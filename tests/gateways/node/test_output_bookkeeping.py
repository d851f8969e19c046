"""GatewayNode keeps which links may have output and the earliest link deadline incrementally (so a
1 000-site simulation does not scan every link after every event); what it answers must stay what a scan
of every link answers, event after event, in a whole simulated run."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateways.node.actions import NodeAction, Wake
from gateways.node.node import GatewayNode
from sims.des.scenario import load_scenario
from sims.des.world import Simulation

SCENARIOS = Path(__file__).resolve().parents[3] / "sims" / "scenarios"


def _scanned_wakes(node: GatewayNode) -> list[int]:
    return [ch.link_id for ch in node.mesh.channels.values() if not ch.ended and ch.pending()]


def _scanned_deadline(node: GatewayNode) -> float | None:
    due = list(node.mesh.no_link_deadline.values())
    if node.scheduler.next_report is not None:
        due.append(node.scheduler.next_report)
    if node.engine is not None:
        d = node.engine.next_deadline()
        if d is not None:
            due.append(d)
    t = node.cfg.timeouts
    lost_after = t.heartbeat_interval * t.heartbeat_misses
    for ch in node.mesh.channels.values():
        if not ch.ended:
            due += [ch.next_beat, ch.last_rx + lost_after]
    return min(due) if due else None


@pytest.mark.parametrize("scenario", ["four-sites", "straggler-seed002"])
def test_incremental_answers_equal_a_scan_of_every_link(
    scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pop, deadline = GatewayNode.pop_actions, GatewayNode.next_deadline
    checked = {"pop": 0, "wakes": 0, "deadline": 0}

    def checked_pop(node: GatewayNode) -> list[NodeAction]:
        want = _scanned_wakes(node)
        got = pop(node)
        assert [a.link_id for a in got if type(a) is Wake] == want
        checked["pop"] += 1
        checked["wakes"] += len(want)
        return got

    def checked_deadline(node: GatewayNode) -> float | None:
        want = _scanned_deadline(node)
        got = deadline(node)
        assert got == want
        checked["deadline"] += 1
        return got

    monkeypatch.setattr(GatewayNode, "pop_actions", checked_pop)
    monkeypatch.setattr(GatewayNode, "next_deadline", checked_deadline)
    sc = load_scenario(SCENARIOS / f"{scenario}.toml").replace(iterations=6)
    result = Simulation(sc).run()
    assert result.finished
    assert checked["pop"] > 100 and checked["wakes"] > 10 and checked["deadline"] > 100
