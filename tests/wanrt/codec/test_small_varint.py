"""The reference kernels' Python-int path for small index streams agrees with their NumPy path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wanrt.codec.reference_kernels as rk


def _outcome(f: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    try:
        return ("ok", f(*args, **kw))
    except Exception as exc:  # compared as (type, message, fields) below
        return ("err", type(exc).__name__, str(exc), getattr(exc, "fields", None))


def _both(monkeypatch: pytest.MonkeyPatch, f: Callable[..., Any], *args: Any, **kw: Any) -> tuple[Any, Any]:
    small = _outcome(f, *args, **kw)
    with monkeypatch.context() as m:
        m.setattr(rk, "SMALL_COUNT", -1)  # every stream takes the array path
        array = _outcome(f, *args, **kw)
    return small, array


def _same(a: Any, b: Any) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "err":
        return bool(a == b)
    x, y = a[1], b[1]
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
    return bool(x == y)


@settings(max_examples=300, deadline=None)
@given(
    idx=st.lists(st.integers(-3, 1 << 41), min_size=1, max_size=rk.SMALL_COUNT),
    sort=st.booleans(),
    n_blocks=st.integers(1, 1 << 41),
)
def test_gap_stats_and_encode_agree(idx: list[int], sort: bool, n_blocks: int) -> None:
    mp = pytest.MonkeyPatch()
    arr = np.array(sorted(set(idx)) if sort else idx, dtype=np.int64)
    small, array = _both(mp, rk.gap_stats, arr, n_blocks)
    assert _same(small, array), (small, array)
    if small[0] == "ok" and small[1][0]:
        nbytes = small[1][2]
        for claimed in (nbytes, nbytes + 1):
            e_small, e_array = _both(mp, rk.varint_encode, arr, claimed)
            assert _same(e_small, e_array), (e_small, e_array)


@settings(max_examples=300, deadline=None)
@given(
    stream=st.binary(min_size=0, max_size=rk.SMALL_COUNT),
    count=st.integers(1, rk.SMALL_COUNT),
    n_blocks=st.sampled_from([1, 2, 100, 127, 128, 4096, 1 << 20, 1 << 40]),
)
def test_decode_agrees_on_any_bytes(stream: bytes, count: int, n_blocks: int) -> None:
    mp = pytest.MonkeyPatch()
    b = np.frombuffer(stream, dtype=np.uint8)
    small, array = _both(mp, rk.varint_decode, b, count, n_blocks, peer="p")
    assert _same(small, array), (small, array)


def test_round_trip_of_small_streams() -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        nb = int(rng.integers(1, 1 << 30))
        k = int(rng.integers(1, min(nb, rk.SMALL_COUNT) + 1))
        idx = np.sort(rng.choice(nb, size=k, replace=False)).astype(np.int64)
        ok, _, nbytes = rk.gap_stats(idx, nb)
        assert ok
        enc = rk.varint_encode(idx, nbytes)
        np.testing.assert_array_equal(rk.varint_decode(enc, k, nb), idx)
