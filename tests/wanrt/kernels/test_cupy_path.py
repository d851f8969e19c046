"""The CuPy path against the NumPy reference (skipped without cupy and a CUDA device).

Bit-exact where the CPU paths are (tests/wanrt/kernels/test_block_kernels.py holds the fused CPU path to
the same standard): the selection's indices and sums, every optimizer's parameters and state. Top-k is
compared on data without ties at the cut (its tie-break may differ, docs/kernels.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_support import CUDA_SKIP
from tests.wanrt.kernels.conftest import forced_path, random_update
from wanrt.kernels import (
    COMPRESSOR_KINDS,
    OPTIMIZER_KINDS,
    ErrorFeedback,
    kernels_by_name,
    make_compressor,
    make_sparse_optimizer,
)
from wanrt.kernels.state_transfer import export_state, import_state

pytestmark = [pytest.mark.cuda, CUDA_SKIP]


def _cp():  # type: ignore[no-untyped-def]
    import cupy

    return cupy


@pytest.mark.parametrize("bs", [1, 5, 16, 64, 128])
@pytest.mark.parametrize("with_add", [False, True])
def test_select_above_equals_the_reference(bs: int, with_add: bool) -> None:
    cp = _cp()
    ref, dev = kernels_by_name("numpy"), kernels_by_name("cupy")
    rng = np.random.default_rng(bs)
    n = 100_003
    x = rng.standard_normal(n).astype(np.float32)
    add = rng.standard_normal(n).astype(np.float32) if with_add else None
    nb = -(-n // bs)
    sums = ref.block_sums(x + add if add is not None else x, bs)
    v = float(np.quantile(sums, 0.97))
    cap = nb  # everything that passes fits
    hx, dx = x.copy(), cp.asarray(x)
    hi, hs = np.empty(cap, np.int64), np.empty(cap, np.float32)
    di, ds = cp.empty(cap, cp.int64), cp.empty(cap, cp.float32)
    c1, bad1 = ref.select_above(hx, v, bs, hi, hs, add)
    c2, bad2 = dev.select_above(dx, v, bs, di, ds, None if add is None else cp.asarray(add))
    assert (c1, bad1) == (c2, bad2)
    np.testing.assert_array_equal(hi[:c1], cp.asnumpy(di[:c2]))
    np.testing.assert_array_equal(hs[:c1], cp.asnumpy(ds[:c2]))
    np.testing.assert_array_equal(hx, cp.asnumpy(dx))  # the residual update, bit for bit
    np.testing.assert_array_equal(ref.block_sums(hx, bs), cp.asnumpy(dev.block_sums(dx, bs)))


def test_select_above_on_unaligned_views_equals_the_reference() -> None:
    """A view starting one float in is not 16-byte aligned: the scalar loads run instead of float4."""
    cp = _cp()
    ref, dev = kernels_by_name("numpy"), kernels_by_name("cupy")
    rng = np.random.default_rng(11)
    x = rng.standard_normal(16 * 999 + 7).astype(np.float32)
    add = rng.standard_normal(x.shape[0]).astype(np.float32)
    dx = cp.asarray(np.concatenate([[0.0], x]).astype(np.float32))[1:]
    da = cp.asarray(np.concatenate([[0.0], add]).astype(np.float32))[1:]
    assert dx.data.ptr % 16 != 0
    hx, cap = x.copy(), 1000
    hi, hs = np.empty(cap, np.int64), np.empty(cap, np.float32)
    di, ds = cp.empty(cap, cp.int64), cp.empty(cap, cp.float32)
    c1, _ = ref.select_above(hx, 12.0, 16, hi, hs, add)
    c2, _ = dev.select_above(dx, 12.0, 16, di, ds, da)
    assert c1 == c2
    np.testing.assert_array_equal(hi[:c1], cp.asnumpy(di[:c2]))
    np.testing.assert_array_equal(hx, cp.asnumpy(dx))


def test_select_above_counts_past_the_buffer_and_flags_nan() -> None:
    cp = _cp()
    dev = kernels_by_name("cupy")
    x = cp.ones(16 * 1000, dtype=cp.float32)
    x[16 * 500] = cp.nan
    di, ds = cp.empty(10, cp.int64), cp.empty(10, cp.float32)
    count, bad = dev.select_above(x, 1.0, 16, di, ds)
    assert count == 1000 and bad


@pytest.mark.parametrize("bs", [1, 5, 16])
def test_gather_and_zero_blocks_equal_the_reference_with_a_partial_last_block(bs: int) -> None:
    cp = _cp()
    ref, dev = kernels_by_name("numpy"), kernels_by_name("cupy")
    rng = np.random.default_rng(bs)
    n = 16 * 101 + 3
    nb = -(-n // bs)
    x = rng.standard_normal(n).astype(np.float32)
    idx = np.sort(rng.choice(nb, size=nb // 3, replace=False)).astype(np.int64)
    idx[-1] = nb - 1  # the partial block
    dx, didx = cp.asarray(x), cp.asarray(idx)
    np.testing.assert_array_equal(ref.gather(x, idx, bs), cp.asnumpy(dev.gather(dx, didx, bs)))
    hx = x.copy()
    ref.zero_blocks(hx, idx, bs)
    dev.zero_blocks(dx, didx, bs)
    np.testing.assert_array_equal(hx, cp.asnumpy(dx))


@pytest.mark.parametrize("ties", [False, True])
def test_threshold_stats_and_trim_equal_the_reference(ties: bool) -> None:
    """The controller's two numbers and the trim to cap, with many candidates tied at the cut (taken in
    index order by both)."""
    cp = _cp()
    ref, dev = kernels_by_name("numpy"), kernels_by_name("cupy")
    rng = np.random.default_rng(5)
    count, cap, aim = 5000, 3100, 3800
    sums = rng.uniform(1, 2, count).astype(np.float32)
    if ties:
        sums = np.round(sums * 8).astype(np.float32) / 8  # 9 distinct values: every cut is a tie
    ids = np.sort(rng.choice(10 * count, size=count, replace=False)).astype(np.int64)
    part = np.partition(sums, [count - aim, count - cap])
    dsums, dids = cp.asarray(sums), cp.asarray(ids)
    dpart = dev.partition(dsums, [count - aim, count - cap])
    assert ref.threshold_stats(sums, part, count, aim, 1.0, 1.05) == dev.threshold_stats(
        dsums, dpart, count, aim, 1.0, 1.05
    )
    np.testing.assert_array_equal(
        ref.trim(ids, sums, part, count, cap), cp.asnumpy(dev.trim(dids, dsums, dpart, count, cap))
    )


_STATS_CASES = {  # case -> (aim, cap, buffer) as functions of how many blocks pass
    "all_fit": (lambda p: p + 10, lambda p: p + 20, lambda p: p + 50),
    "trim": (lambda p: p // 2, lambda p: 2 * p // 3, lambda p: p + 50),
    "ties": (lambda p: p // 2, lambda p: 2 * p // 3, lambda p: p + 50),
    "few": (lambda p: 2 * p, lambda p: 3 * p, lambda p: 4 * p),
    "overflow": (lambda p: p // 2, lambda p: p // 3, lambda p: p // 2),
}


@pytest.mark.parametrize("bs", [1, 5, 16])
@pytest.mark.parametrize("with_add", [False, True])
@pytest.mark.parametrize("case", sorted(_STATS_CASES))
def test_select_stats_equals_the_reference(bs: int, with_add: bool, case: str) -> None:
    """The fused pass + order/cut block (no sort, one read) against the reference's select_above,
    partition, threshold_stats and trim: the count, the controller's numbers, the payload's blocks, the
    ordered candidates and the residual update, bit for bit; ties at the cut taken in index order."""
    _check_select_stats(bs, with_add, case, 300_007)


@pytest.mark.parametrize("case", ["trim", "ties"])
def test_select_stats_equals_the_reference_with_many_candidates(case: str) -> None:
    """Tens of thousands of candidates: every thread of the order/cut block walks several CUDA blocks'
    ranges and the trim several chunks of 1024."""
    _check_select_stats(1, True, case, 1_600_003)


@pytest.mark.parametrize("case", ["trim", "ties"])
def test_select_stats_equals_the_reference_past_the_shared_layout(case: str) -> None:
    """More CUDA blocks of candidates than order_cut's shared layout holds (WANRT_MAX_GROUPS: 9 M
    elements at block 1 are 4 395 of them): its serial layout, the same results."""
    _check_select_stats(1, False, case, 9_000_001, quantile=0.995)


def _check_select_stats(bs: int, with_add: bool, case: str, n: int, quantile: float = 0.98) -> None:
    cp = _cp()
    ref, dev = kernels_by_name("numpy"), kernels_by_name("cupy")
    rng = np.random.default_rng(100 * bs + 10 * with_add + len(case))
    x = rng.standard_normal(n).astype(np.float32)
    add = rng.standard_normal(n).astype(np.float32) if with_add else None
    if case == "ties":  # values on a coarse grid: many block sums equal, the cut falls inside a tie
        x = (np.round(x * 2) / 2).astype(np.float32)
        add = None if add is None else (np.round(add * 2) / 2).astype(np.float32)
    sums = ref.block_sums(x + add if add is not None else x, bs)
    v = float(np.quantile(sums, quantile))
    passed = int((sums >= np.float32(v)).sum())
    aim_f, cap_f, buf_f = _STATS_CASES[case]
    aim, cap, buffer = max(1, aim_f(passed)), max(1, cap_f(passed)), max(1, buf_f(passed))
    hx, dx = x.copy(), cp.asarray(x)
    hi, hs = np.empty(buffer, np.int64), np.empty(buffer, np.float32)
    di, ds = cp.empty(buffer, cp.int64), cp.empty(buffer, cp.float32)
    da = None if add is None else cp.asarray(add)
    a = ref.select_stats(hx, v, bs, hi, hs, add, aim, cap, 1.05)
    b = dev.select_stats(dx, v, bs, di, ds, da, aim, cap, 1.05)
    assert (a.passed, a.nonfinite, a.aim_v, a.probe) == (b.passed, b.nonfinite, b.aim_v, b.probe)
    assert a.passed == passed
    np.testing.assert_array_equal(hx, cp.asnumpy(dx))  # the residual update, bit for bit
    if case == "overflow":
        assert a.ids is None and b.ids is None
        return
    np.testing.assert_array_equal(a.ids, cp.asnumpy(b.ids))
    np.testing.assert_array_equal(hi[:passed], cp.asnumpy(di[:passed]))
    np.testing.assert_array_equal(hs[:passed], cp.asnumpy(ds[:passed]))
    if case == "few":
        assert a.aim_v is None
    elif case in ("trim", "ties"):
        assert len(a.ids) == cap


@pytest.mark.parametrize("case", ["trim", "few"])
def test_select_stats_by_sorting_equals_the_reference(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``fused_max_aim`` (element-wise threshold-v on a large layer) the sort path runs: the same
    results."""
    monkeypatch.setattr(type(kernels_by_name("cupy")), "fused_max_aim", 0)
    _check_select_stats(1, True, case, 300_007)


def test_select_stats_flags_a_non_finite_sum() -> None:
    cp = _cp()
    dev = kernels_by_name("cupy")
    x = cp.ones(16 * 1000, dtype=cp.float32)
    x[16 * 500 + 3] = cp.inf
    di, ds = cp.empty(2000, cp.int64), cp.empty(2000, cp.float32)
    r = dev.select_stats(x, 1.0, 16, di, ds, None, 500, 600, 1.05)
    assert r.passed == 1000 and r.nonfinite and r.ids is None


@pytest.mark.parametrize("kind", COMPRESSOR_KINDS)
def test_compressors_match_the_reference(kind: str) -> None:
    cp = _cp()
    rng = np.random.default_rng(0)
    host = make_compressor(kind, density=0.01)
    dev = make_compressor(kind, density=0.01)
    for _ in range(4):
        g = rng.standard_normal(100_003).astype(np.float32)
        a, b = host.compress(0, g), dev.compress(0, cp.asarray(g))
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.values, b.values)


@pytest.mark.parametrize("kind", ["threshold_v_block", "threshold_v", "topk"])
def test_error_feedback_matches_the_reference(kind: str) -> None:
    cp = _cp()
    rng = np.random.default_rng(3)
    host, dev = make_compressor(kind, density=0.02), make_compressor(kind, density=0.02)
    ef_h, ef_d = ErrorFeedback(), ErrorFeedback()
    for _ in range(12):  # past the first (sampled) threshold into the AIMD steps and the trim
        g = (rng.standard_normal(50_000) * rng.uniform(0.5, 2)).astype(np.float32)
        a, b = ef_h.compress(0, g, host), ef_d.compress(0, cp.asarray(g), dev)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(ef_h.residual(0), cp.asnumpy(ef_d.residual(0)))


def test_threshold_state_survives_a_host_checkpoint() -> None:
    """A checkpoint holds host values; restored onto a device layer, the threshold must carry on (not be
    sampled afresh): the device run then equals the same story on the host, step for step."""
    cp = _cp()
    rng = np.random.default_rng(4)
    grads = [rng.standard_normal(40_000).astype(np.float32) for _ in range(5)]
    out = []
    for device in (False, True):
        c = make_compressor("threshold_v_block", density=0.01)
        for g in grads[:3]:
            c.compress(0, cp.asarray(g) if device else g)
        restored = make_compressor("threshold_v_block", density=0.01)
        restored.load_state_dict(c.state_dict())
        payloads = [restored.compress(0, cp.asarray(g) if device else g) for g in grads[3:]]
        out.append((restored.threshold(0), payloads))
    (v_host, p_host), (v_dev, p_dev) = out
    assert v_host == v_dev
    for a, b in zip(p_host, p_dev, strict=True):
        np.testing.assert_array_equal(a.indices, b.indices)


@pytest.mark.parametrize("kind", OPTIMIZER_KINDS)
@pytest.mark.parametrize("bs", [1, 3, 16, 512])
def test_optimizers_equal_the_reference_bit_for_bit(kind: str, bs: int) -> None:
    cp = _cp()
    rng = np.random.default_rng(bs)
    n = 5003
    p = rng.standard_normal(n).astype(np.float32)
    q = cp.asarray(p)
    hyper: dict[str, object] = {"lr": 0.01, "weight_decay": 0.01}
    if kind == "momentum":
        hyper["nesterov"] = True
    a, b = make_sparse_optimizer(kind, **hyper), make_sparse_optimizer(kind, **hyper)
    for _ in range(6):
        upd = random_update(rng, n, bs, 0.3)
        with forced_path("numpy"):  # the reference (the fused CPU path agrees with it to 1e-6 only)
            a.step(0, p, upd)
        b.step(0, q, upd)
    np.testing.assert_array_equal(cp.asnumpy(q), p)
    sa, sb = a.state_dict()["params"], b.state_dict()["params"]
    for name in a.state_layout:
        np.testing.assert_array_equal(sa[0][name], sb[0][name])


@pytest.mark.parametrize("kind", ["momentum", "adam"])
def test_optimizer_state_transfer_to_a_cuda_parameter(kind: str) -> None:
    """Resync (docs/chaos.md): state exported from a device optimizer, imported into another one whose
    parameter is a CUDA tensor; both then take the same steps to the same bits."""
    import torch

    cp = _cp()
    rng = np.random.default_rng(7)
    n, bs = 4096 + 5, 16
    src = make_sparse_optimizer(kind, lr=0.01)
    p_src = cp.asarray(rng.standard_normal(n).astype(np.float32))
    for _ in range(3):
        src.step(0, p_src, random_update(rng, n, bs, 0.2))
    arrays = export_state(src, [n], bs)
    dst = make_sparse_optimizer(kind, lr=0.01)
    import_state(dst, [n], bs, arrays)
    p_dst = torch.from_dlpack(p_src.copy()).cuda()
    for _ in range(3):
        upd = random_update(rng, n, bs, 0.2)
        src.step(0, p_src, upd)
        dst.step(0, p_dst, upd)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(p_src), p_dst.cpu().numpy())
    for x, y in zip(export_state(src, [n], bs), export_state(dst, [n], bs), strict=True):
        np.testing.assert_array_equal(x, y)


def test_torch_cuda_parameter_is_updated_in_place() -> None:
    import torch

    rng = np.random.default_rng(8)
    p = torch.randn(3000, device="cuda")
    ref = p.cpu().numpy().copy()
    opt_d, opt_h = make_sparse_optimizer("adamw", lr=0.01), make_sparse_optimizer("adamw", lr=0.01)
    for _ in range(3):
        upd = random_update(rng, 3000, 16, 0.25)
        opt_d.step(0, p, upd)
        with forced_path("numpy"):
            opt_h.step(0, ref, upd)
    np.testing.assert_array_equal(p.cpu().numpy(), ref)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_updates_from_pinned_buffers_and_numpy_equal_the_reference(kind: str) -> None:
    """cupy_staging: updates filled in place into owners' pinned buffers (refilled right after each step,
    so a refill must wait for its copy) and ordinary NumPy ones, many more than the staging's slots, in
    back-to-back steps on two parameters: the same bits as the reference."""
    from wanrt.payload import SparsePayload

    cp = _cp()
    k = kernels_by_name("cupy")
    rng = np.random.default_rng(11)
    n, bs = 20_003, 16
    host = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    dev = [cp.asarray(h) for h in host]
    ref, ours = make_sparse_optimizer(kind, lr=0.01), make_sparse_optimizer(kind, lr=0.01)
    bufs = [k.pinned_update() for _ in range(3)]  # type: ignore[attr-defined]
    for step in range(20):
        for key in (0, 1):
            upd = random_update(rng, n, bs, 0.05 + 0.02 * (step % 3))
            with forced_path("numpy"):
                ref.step(key, host[key], upd)
            if step % 4 == 3:
                ours.step(key, dev[key], upd)  # a pageable update: copied into the staging's own buffer
                continue
            idx, vals = bufs[(2 * step + key) % 3].arrays(upd.nnz_blocks, upd.nnz)
            idx[:] = upd.indices
            vals[:] = upd.values
            ours.step(key, dev[key], SparsePayload(0, n, bs, idx, vals, "fp32"))
    for h, d in zip(host, dev, strict=True):
        np.testing.assert_array_equal(cp.asnumpy(d), h)


def test_a_pinned_buffer_with_other_sizes_is_copied_not_sent_as_it_is() -> None:
    """An update whose arrays are slices of an owner's buffer (not the arrays it handed out) still lands
    right: the staging copies it instead of sending the buffer's whole current fill."""
    from wanrt.payload import SparsePayload

    cp = _cp()
    k = kernels_by_name("cupy")
    rng = np.random.default_rng(12)
    n, bs = 4096, 16
    p = rng.standard_normal(n).astype(np.float32)
    d = cp.asarray(p)
    upd = random_update(rng, n, bs, 0.5)
    buf = k.pinned_update()  # type: ignore[attr-defined]
    idx, vals = buf.arrays(upd.nnz_blocks + 3, upd.nnz + 3 * bs)
    idx[: upd.nnz_blocks] = upd.indices
    vals[: upd.nnz] = upd.values
    part = SparsePayload(0, n, bs, idx[: upd.nnz_blocks], vals[: upd.nnz], "fp32")
    a, b = make_sparse_optimizer("sgd", lr=0.1), make_sparse_optimizer("sgd", lr=0.1)
    with forced_path("numpy"):
        a.step(0, p, upd)
    b.step(0, d, part)
    np.testing.assert_array_equal(cp.asnumpy(d), p)
