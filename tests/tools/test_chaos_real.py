"""tools/chaos_soak.py --real-clients (tools/chaos_real.py): the accounting on hand-made rounds logs, and a
small soak — one trainer kill with an immediate relaunch, one gateway SIGKILL and restart, and the second
run at the end — with the keys issue 21 asks for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import chaos_real
from tools.chaos_real import RealPlan, account, meets


def _write(path: Path, recs: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"k": "push", "it"')  # a cut last line


def test_account_follows_folded_pushes_and_finds_lost_and_doubled_ones(tmp_path: Path) -> None:
    _write(
        tmp_path / "rounds-a.jsonl",
        [
            {"k": "push", "it": 0, "layer": 0, "covers": []},
            {"k": "push", "it": 1, "layer": 0, "covers": []},  # resent later, folded into 3
            {"k": "push", "it": 2, "layer": 0, "covers": []},  # never counted: lost
            {"k": "push", "it": 3, "layer": 0, "covers": [1]},
            {"k": "push", "it": 4, "layer": 0, "covers": []},  # counted twice
            {"k": "deliver", "it": 0, "layer": 0, "ids": [["a", 0], ["b", 0]]},
            {"k": "deliver", "it": 3, "layer": 0, "ids": [["a", 3], ["b", 3]]},
            {"k": "deliver", "it": 4, "layer": 0, "ids": [["a", 4], ["b", 4]]},
            {"k": "deliver", "it": 5, "layer": 0, "ids": [["a", 4], ["b", 5]]},
        ],
    )
    _write(
        tmp_path / "rounds-b.jsonl",
        [
            {"k": "push", "it": 0, "layer": 0, "covers": []},
            {"k": "deliver", "it": 0, "layer": 0, "ids": [["b", 0], ["a", 0]]},  # the same round: agrees
            {"k": "deliver", "it": 3, "layer": 0, "ids": [["b", 3]]},  # disagrees with site a's
            {"k": "push", "it": 9, "layer": 0, "covers": []},  # beyond `upto`: not judged
        ],
    )
    acc = account(tmp_path, ("a", "b"), upto=8)
    assert acc == {"pushes": 6, "pushes_lost": 1, "pushes_double_counted": 1, "result_conflicts": 1}


def test_account_follows_pushes_folded_into_a_push_whose_result_came_at_once(tmp_path: Path) -> None:
    """Issue 21's pushes_lost 100: after a gateway restart, the trainer's pushes below the new gateway's
    join iteration are folded into its next push, whose result is often delivered inside the very call
    that took it (the peer's contribution was already there), so the push's own line names no covers; the
    gateway's deliver line names them (``covers``: [carrier iteration, folded iteration])."""
    _write(
        tmp_path / "rounds-a.jsonl",
        [
            {"k": "push", "it": 1, "layer": 0, "covers": []},  # taken by the killed gateway
            {"k": "push", "it": 2, "layer": 0, "covers": []},  # resent to the restarted one (join_at 3)
            {
                "k": "deliver",
                "it": 3,
                "layer": 0,
                "ids": [["a", 3], ["b", 1], ["b", 2], ["b", 3]],
                "covers": [[3, 1], [3, 2]],
            },
            {"k": "push", "it": 3, "layer": 0, "covers": []},  # logged after its result: pending is gone
        ],
    )
    _write(
        tmp_path / "rounds-b.jsonl",
        [{"k": "deliver", "it": 3, "layer": 0, "ids": [["a", 3], ["b", 1], ["b", 2], ["b", 3]]}],
    )
    acc = account(tmp_path, ("a", "b"), upto=8)
    assert acc == {"pushes": 3, "pushes_lost": 0, "pushes_double_counted": 0, "result_conflicts": 0}


def test_account_leaves_out_a_result_only_a_killed_gateway_made(tmp_path: Path) -> None:
    """The CI failure (pushes_double_counted 1): gateway a made round 3's result and was killed before its
    own push left for b; b never had round 3, settled it without a once the fresh gateway joined at 5 and
    carried its push 3 into round 5; a's trainer re-sent push 3, folded into 5. Round 3's result is in no
    site's parameters (a's trainer resyncs), so b's push 3 is counted once, in round 5 — and a push folded
    twice into one carrier is double counted."""
    _write(
        tmp_path / "rounds-a.jsonl",
        [
            {"k": "start"},
            {"k": "push", "it": 3, "layer": 0, "covers": []},
            {"k": "deliver", "it": 3, "layer": 0, "ids": [["a", 3], ["b", 3]], "covers": []},
            {"k": "start"},
            {"k": "push", "it": 3, "layer": 0, "covers": []},  # re-sent: below the join, folded into 5
            {"k": "push", "it": 4, "layer": 0, "covers": []},  # also below the join
            {
                "k": "deliver",
                "it": 5,
                "layer": 0,
                "ids": [["a", 5], ["b", 3], ["b", 5]],
                "covers": [[5, 3], [5, 4], [5, 4]],
            },
            {"k": "push", "it": 5, "layer": 0, "covers": []},
        ],
    )
    _write(
        tmp_path / "rounds-b.jsonl",
        [
            {"k": "start"},
            {"k": "push", "it": 3, "layer": 0, "covers": []},
            {"k": "push", "it": 5, "layer": 0, "covers": []},
            {"k": "deliver", "it": 5, "layer": 0, "ids": [["a", 5], ["b", 3], ["b", 5]], "covers": []},
        ],
    )
    acc = account(tmp_path, ("a", "b"), upto=8)
    # a4 was folded twice into a5 (the ledger bug fixed with test_a_resent_push_sent_again_before...)
    assert acc == {"pushes": 5, "pushes_lost": 0, "pushes_double_counted": 1, "result_conflicts": 0}
    # without the start lines (one life each) round 3 counts: b3 in rounds 3 and 5, a3 in round 3 and
    # folded into a5, a4 folded twice
    for site in "ab":
        path = tmp_path / f"rounds-{site}.jsonl"
        path.write_text("".join(x + "\n" for x in path.read_text().splitlines() if '"start"' not in x))
    assert account(tmp_path, ("a", "b"), upto=8)["pushes_double_counted"] == 3


@pytest.mark.slow
def test_a_small_real_client_soak_meets_the_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chaos_real, "EVENTS", ("trainer_restart", "gateway_kill"))
    plan = RealPlan(seed=2, rounds_of_events=1, steps=320, compute_s=0.06, settle_its=40)
    report = chaos_real.run(plan, tmp_path, quick=True)
    assert report["events"] == 2 and report["events_never_recovered"] == 0, report["rows"]
    # correctness keys (the times are the benchmark's to report, not a test's to assert); pushes_lost
    # follows the pushes a restarted gateway folded (test_account_follows_pushes_folded_into_a_push...)
    for key in ("pushes_lost", "pushes_double_counted", "ranks_identical_at_end", "foreign_run_refused"):
        assert meets(key, report[key]), (key, report)
    assert report["pushes"] > 0 and report["result_conflicts"] == 0
    for key in ("trainer_rejoin_s", "healthy_site_stall_s", "gateway_restart_loss_jump"):
        assert report[key] is not None, (key, report["rows"])
