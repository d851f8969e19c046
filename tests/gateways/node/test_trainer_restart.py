"""The gateway's part of KILL_RESTART: check the rank, forward once, admit one replacement run."""

from __future__ import annotations

import pytest

from gateways.config import GatewayConfig
from gateways.membership.trainer_ledger import TrainerLedger
from gateways.node import GatewayNode, ToTrainer
from gateways.node.actions import ToScheduler
from gateways.node.trainer_restart import TrainerRestart
from gateways.rounds.config import RoundConfig
from wanrt.errors import ConfigError
from wanrt.payload import SparsePayload
from wanrt.protocol import ConfigUpdate, Notice, Push, Telemetry
from wanrt.protocol.scheduler.messages import Announce, AnnounceReply


def test_the_rank_must_exist_at_this_site() -> None:
    assert TrainerRestart.problem({"density": 0.1}, None) is None
    assert TrainerRestart.problem({"restart": 1}, 2.0) is None
    assert "2 ranks" in (TrainerRestart.problem({"restart": 2}, 2.0) or "")
    assert "not reported" in (TrainerRestart.problem({"restart": 0}, None) or "")


def test_the_order_is_kept_out_of_what_later_sessions_get_and_admits_one_new_run() -> None:
    r = TrainerRestart()
    assert r.committed(3, {"density": 0.1}, 10) == {"density": 0.1} and r.order is None
    assert r.start_at(7) is None and not r.admit()
    keep = r.committed(4, {"density": 0.1, "restart": 0}, 20)
    assert keep == {"density": 0.1}
    assert r.start_at(15) == 20  # the order's iteration ...
    assert r.start_at(23) == 23  # ... or past what the old process pushed
    assert r.admit() and r.replaced == 1
    assert r.order is None and not r.admit()  # once


def test_the_ledger_says_where_a_replacement_may_start() -> None:
    ledger = TrainerLedger("a", join_at=0)
    assert ledger.next_push() == 0
    p = SparsePayload.empty(0, 8, 1)
    ledger.on_push(0, 0, p)
    ledger.on_push(1, 0, p)
    ledger.on_push(0, 1, SparsePayload.empty(1, 8, 1))
    assert ledger.next_push() == 2
    assert TrainerLedger("a", join_at=30).next_push() == 30


def _node() -> GatewayNode:
    cfg = GatewayConfig(site="a", job="j", secret="x" * 32, rounds=RoundConfig(topology="star"))
    node = GatewayNode(cfg, 0.0)
    node.start(0.0)
    node.scheduler_connected(0.0)
    node.trainer_connected(1)
    node.pop_actions()
    return node


def test_a_gateway_node_checks_forwards_once_and_lets_the_replacement_in() -> None:
    node = _node()
    node.scheduler_message(Announce(1, "prepare", 10, {"restart@a": 0}), 1.0)
    (reply,) = [a.msg for a in node.pop_actions() if isinstance(a, ToScheduler)]
    assert isinstance(reply, AnnounceReply) and not reply.accepted and "not reported" in reply.problem
    node.trainer_telemetry(Telemetry("a", 0, {"world_size": 1.0, "rank.0.compute_s": 0.1}), 1.0)
    node.scheduler_message(Announce(2, "prepare", 10, {"restart@a": 0, "density": 0.5}), 1.0)
    (reply,) = [a.msg for a in node.pop_actions() if isinstance(a, ToScheduler)]
    assert isinstance(reply, AnnounceReply) and reply.accepted, reply
    # the trainer pushes its iterations up to the order's
    for it in range(10):
        node.trainer_push(1, Push("j", it, 0, 0, "a", SparsePayload.empty(0, 8, 1)), 1.1)
    node.pop_actions()
    node.scheduler_message(Announce(2, "commit", 10, {"restart@a": 0, "density": 0.5}), 1.2)
    sent = [a.msg for a in node.pop_actions() if isinstance(a, ToTrainer) and isinstance(a.msg, ConfigUpdate)]
    assert [m.values for m in sent] == [{"restart": 0, "density": 0.5}]
    assert "cfg.restart" not in node.telemetry(1.3).metrics  # a restarted scheduler adopts no order
    # the old process leaves; a new run may train here once, from the order's iteration, and resyncs
    node.trainer_disconnected(1, "restart")
    assert node.trainer_welcome_info()["restart_from"] == 10
    assert node.trainer_model_problem({"run": "r1"}) is None  # the first run of this gateway
    assert node.trainer_model_problem({"run": "r2"}) is None  # the replacement
    assert node.status()["restart"] == {"order": None, "replaced": 1}
    assert "restart_from" not in node.trainer_welcome_info()
    node.trainer_connected(2)
    out = [a.msg for a in node.pop_actions() if isinstance(a, ToTrainer)]
    notices = [m for m in out if isinstance(m, Notice) and m.kind == "resync"]
    assert notices and notices[0].info["iteration"] == 10
    replayed = [m for m in out if isinstance(m, ConfigUpdate)]
    assert [m.values for m in replayed] == [{"density": 0.5}]  # the order is not replayed
    assert node.trainer_model_problem({"run": "r3"}) is not None  # a third run is refused as before
    with pytest.raises(ConfigError):
        node.apply_config({"restart": 0}, None, 2.0)  # POST /config cannot order one


def test_per_rank_times_make_room_when_a_report_would_hold_too_many_keys() -> None:
    from wanrt.protocol.limits import MAX_TELEMETRY_KEYS

    node = _node()
    metrics = {f"k{i}": 1.0 for i in range(MAX_TELEMETRY_KEYS - 20)}  # a leader's other measurements
    ranks = {f"rank.{r}.compute_s": 0.1 * (r + 1) for r in range(16)}
    node.trainer_telemetry(Telemetry("a", 3, {"world_size": 16.0, **metrics, **ranks}), 1.0)
    m = node.telemetry(1.1).metrics
    assert len(m) == MAX_TELEMETRY_KEYS
    kept = sorted(int(k.split(".")[2]) for k in m if k.startswith("trainer.rank."))
    assert kept and kept == list(range(16 - len(kept), 16))  # the slowest ranks stay
