"""End to end: 2 sites x 2 gloo ranks train over loopback through the fake gateway (real protocol)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wanrt.client.two_sites import launch
from tools.harness.fake_gateway import FakeGateway, run_in_thread

SECRET = b"0123456789abcdef-test-secret"
SITES = ("a", "b")


@pytest.fixture
def secret_path(tmp_path: Path) -> Path:
    p = tmp_path / "job.key"
    p.write_bytes(SECRET + b"\n")
    return p


def test_sparse_and_dense_training_converge_identically_on_every_rank(
    tmp_path: Path, secret_path: Path
) -> None:
    dense = FakeGateway(f"unix://{tmp_path}/dense.sock", sites=SITES, job="e2e", secret=SECRET)
    sparse = FakeGateway(f"unix://{tmp_path}/sparse.sock", sites=SITES, job="e2e", secret=SECRET)
    with run_in_thread(dense) as loop:
        import asyncio

        asyncio.run_coroutine_threadsafe(sparse.start(), loop).result(10)
        results = launch(
            tmp_path,
            sites=SITES,
            world=2,
            args=[
                f"--secret-file={secret_path}",
                f"--dense-gateway={dense.url}",
                f"--sparse-gateway={sparse.url}",
            ],
        )
        asyncio.run_coroutine_threadsafe(sparse.stop(), loop).result(10)
    assert dense.errors == [] and sparse.errors == []
    for key, res in results.items():
        assert "error" not in res, (key, res["error"])
    for mode in ("dense", "sparse"):
        digests = {res[mode]["digest"] for res in results.values()}
        assert len(digests) == 1, f"{mode}: ranks ended with different parameters"
    r = results[("a", 0)]
    initial, d, s = r["dense"]["initial"], r["dense"]["loss"], r["sparse"]["loss"]
    assert d < 0.3 * initial, (initial, d)
    assert s < 0.3 * initial, (initial, s)
    assert s <= 1.10 * d, f"sparse path with error feedback ended at {s:.4f}, dense baseline at {d:.4f}"
    assert sparse.pushes == dense.pushes  # every layer of every step, in both modes
    assert sparse.elements < 0.3 * dense.elements  # and the sparse path really sent a fraction


def test_ranks_of_one_site_with_different_models_all_get_the_same_error(
    tmp_path: Path, secret_path: Path
) -> None:
    gw = FakeGateway(f"unix://{tmp_path}/gw.sock", sites=("a",), job="e2e", secret=SECRET)
    with run_in_thread(gw):
        results = launch(
            tmp_path,
            sites=("a",),
            world=2,
            args=[f"--secret-file={secret_path}", f"--dense-gateway={gw.url}", "--wide-ranks=a:1"],
        )
    for rank in (0, 1):
        err = results[("a", rank)].get("error")
        assert err is not None and err["type"] == "ModelMismatch", err
        assert "layer 0 '0.weight'" in err["message"]  # the first layer is already wider
    assert gw.pushes == 0
