"""tools/chaos_memory.py finds what grew between two points of a run, by type, line and component."""

from __future__ import annotations

import tracemalloc

from tools.chaos_memory import MemoryTrace, allocator_mb, component_of


class _Grown:
    __slots__ = ("blob",)

    def __init__(self, n: int) -> None:
        self.blob = bytes(n)


def test_growth_is_found_by_type_without_tracemalloc() -> None:
    trace = MemoryTrace(python_heap=False)
    trace.mark()
    kept = [_Grown(8) for _ in range(5_000)]
    trace.point(1)
    rep = trace.report()
    assert rep["object_types_grown"]["_Grown"] >= 5_000
    assert "traced_growth_mb" not in rep
    assert [p["iteration"] for p in rep["points"]] == [0, 1]
    assert rep["points"][0]["rss"] > 0 and rep["points"][0]["pymalloc_in_use"] > 0
    del kept


def test_growth_is_found_by_line_and_component_with_tracemalloc() -> None:
    was_tracing = tracemalloc.is_tracing()
    trace = MemoryTrace(python_heap=True)
    try:
        trace.mark()
        trace.middle()
        kept = [_Grown(1_000) for _ in range(2_000)]  # ≈ 2 MB, after the halfway snapshot
        rep = trace.report()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    assert rep["traced_growth_mb"] >= 1.5
    assert rep["top_lines"][0]["where"].startswith("tests/tools/test_chaos_memory.py:")
    assert rep["per_component_mb"]["tests/tools/test_chaos_memory.py"] >= 1.5
    assert rep["second_half"]["traced_growth_mb"] >= 1.5  # grown after middle(): a leak, not a fill-up
    del kept


def test_components_are_the_repository_packages() -> None:
    from tools import chaos_memory

    root = chaos_memory.ROOT
    assert component_of(f"{root}/gateways/rounds/engine.py") == "gateways/rounds"
    assert component_of(f"{root}/gateways/config.py") == "gateways"
    assert component_of(f"{root}/tools/chaos_soak.py") == "tools"
    assert component_of("/usr/lib/python3.11/site-packages/numpy/core/numeric.py") == "numpy"
    assert allocator_mb()["rss"] > 0
