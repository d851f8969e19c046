"""Fuzzing the receive path: arbitrary bytes, and mutated valid sessions (bit flips, truncation, lengths
inflated to 2**31, reordered frames, damaged-then-rechecksummed frames, forged header maps). Only messages,
ConnectionClosed, ProtocolError or AuthError may come out; no hang; nothing allocated beyond the limits."""

from __future__ import annotations

import importlib.util
import json
import random
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wanrt.codec import kernel_choice
from wanrt.protocol.fuzz import FUZZ_CONFIG, Input, mutate, record_session, run_input

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sessions() -> list:
    rng = random.Random(1234)
    return [record_session(rng) for _ in range(12)]


def test_recorded_sessions_replay_cleanly(sessions: list) -> None:
    """The corpus itself is valid: replayed to a fresh endpoint, every frame is accepted."""
    for s in sessions:
        for target in ("server", "client"):
            data = b"".join(s.frames(target))
            outcome, messages = run_input(Input(target, data, (), "replay"))
            assert outcome == "closed", outcome
            assert messages >= len(s.frames(target)) // 2


def test_mutated_sessions_only_yield_typed_errors(sessions: list) -> None:
    rng = random.Random(99)
    outcomes: Counter[str] = Counter()
    for _ in range(2500):
        case = mutate(rng, sessions)
        outcome, _ = run_input(case)  # raises FuzzFailure on any contract breach
        outcomes[outcome] += 1
    # the mutators reach every layer: framing limits, auth, the codec, and clean closes
    for expected in ("RemoteProtocolError", "LimitExceeded", "MalformedPayload", "AuthError", "closed"):
        assert outcomes[expected] > 0, outcomes


blobs = st.binary(max_size=600)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blobs, st.sampled_from(["server", "client"]), st.booleans())
def test_arbitrary_bytes_all_at_once_or_byte_by_byte(data: bytes, target: str, bytewise: bool) -> None:
    cuts = tuple(range(1, len(data))) if bytewise else ()
    run_input(Input(target, data, cuts, "hypothesis"))  # type: ignore[arg-type]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), blobs, st.booleans())
def test_arbitrary_bytes_after_a_valid_handshake(data: st.DataObject, tail: bytes, bytewise: bool) -> None:
    s = record_session(random.Random(data.draw(st.integers(0, 3))))
    prefix = b"".join(s.client_frames[:2])
    blob = prefix + tail
    cuts = tuple(range(len(prefix), len(blob))) if bytewise else ()
    run_input(Input("server", blob, cuts, "hypothesis"))


def test_nothing_is_allocated_beyond_the_limits(sessions: list) -> None:
    """Peak traced memory per input stays within the configured limits, whatever the input announces."""
    rng = random.Random(7)
    bound = 8 * FUZZ_CONFIG.max_frame_bytes + FUZZ_CONFIG.max_reassembly_bytes + (1 << 20)
    if kernel_choice._LOADER.started:
        # tracemalloc traces every thread: a fused-kernel compile that an earlier test started in the
        # background (numba, megabytes) would be charged to whichever input is being parsed meanwhile
        kernel_choice._LOADER.wait()
    tracemalloc.start()
    try:
        for _ in range(150):
            case = mutate(rng, sessions)
            tracemalloc.reset_peak()
            run_input(case)
            _, peak = tracemalloc.get_traced_memory()
            assert peak < bound + 2 * len(case.data), (case.mutator, peak)
    finally:
        tracemalloc.stop()


def test_fuzz_tool_counts_outcomes_and_writes_json(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("fuzz_protocol", ROOT / "tools" / "fuzz_protocol.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "fuzz.json"
    assert tool.main(["--n", "150", "--seed", "3", "--sessions", "4", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["n"] == 150 and sum(report["by_outcome"].values()) == 150 and report["failures"] == []
