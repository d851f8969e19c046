"""tools/chaos_soak.py --real-clients merges tools/chaos_probes.py's keys into its report: the soak's own
mistake (a second run against the job's gateways) joins the probes' mistakes, and each key is judged."""

from __future__ import annotations

from typing import Any

import pytest

import tools.chaos_probes as chaos_probes
from tools.chaos_soak import PROBE_TARGETS, _merge_probes, _probe_meets


def _fake_probes(mistakes: object) -> dict[str, object]:
    return {
        "mistakes_failing_fast": mistakes,
        "forged_join_accepted": 0,
        "preauth_flood_blocks_rejoin": 0,
        "closed_link_buffer_mb": 0.5,
        "elapsed_s": 3.0,
    }


@pytest.mark.parametrize(
    ("probed", "refused", "refused_s", "want"),
    [
        ("all", 1, 1.2, "all"),
        ("all", 0, 1.2, ["foreign_run"]),
        ("all", 1, chaos_probes.FAST_S + 1, ["foreign_run"]),
        (["model_mismatch"], 1, 1.2, ["model_mismatch"]),
        (["model_mismatch"], 0, 1.2, ["model_mismatch", "foreign_run"]),
    ],
)
def test_foreign_run_joins_the_mistakes(
    monkeypatch: pytest.MonkeyPatch, probed: object, refused: int, refused_s: float, want: object
) -> None:
    monkeypatch.setattr(chaos_probes, "run_probes", lambda: _fake_probes(probed))
    result: dict[str, Any] = {"foreign_run_refused": refused, "foreign_run_refused_s": refused_s}
    _merge_probes(result)
    assert result["mistakes_failing_fast"] == want
    assert result["probes_elapsed_s"] == 3.0
    assert _probe_meets("mistakes_failing_fast", result["mistakes_failing_fast"]) == (want == "all")


def test_probe_targets() -> None:
    assert set(PROBE_TARGETS) == {
        "mistakes_failing_fast",
        "forged_join_accepted",
        "preauth_flood_blocks_rejoin",
        "closed_link_buffer_mb",
    }
    assert _probe_meets("closed_link_buffer_mb", 64.0)
    assert not _probe_meets("closed_link_buffer_mb", 64.1)
    assert not _probe_meets("closed_link_buffer_mb", None)
    assert _probe_meets("forged_join_accepted", 0)
    assert not _probe_meets("forged_join_accepted", 1)
    assert not _probe_meets("preauth_flood_blocks_rejoin", 1)
