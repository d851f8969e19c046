"""Sparse optimizers: equal to torch.optim on dense updates, to the reference on sparse ones, in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wanrt.kernels.conftest import CPU_PATHS, FAST_PATHS, dense_update, forced_path, random_update
from wanrt.errors import ConfigError, KernelError
from wanrt.kernels import OPTIMIZER_KINDS, make_sparse_optimizer
from wanrt.payload import SparsePayload

TORCH_CASES: list[tuple[str, dict[str, Any], Any]] = [
    ("sgd", {"lr": 0.1}, lambda p, h: torch.optim.SGD(p, **h)),
    ("sgd", {"lr": 0.1, "weight_decay": 0.01}, lambda p, h: torch.optim.SGD(p, **h)),
    ("momentum", {"lr": 0.05, "momentum": 0.9}, lambda p, h: torch.optim.SGD(p, **h)),
    (
        "momentum",
        {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.02},
        lambda p, h: torch.optim.SGD(p, **h),
    ),
    ("momentum", {"lr": 0.05, "momentum": 0.9, "nesterov": True}, lambda p, h: torch.optim.SGD(p, **h)),
    ("adam", {"lr": 1e-2}, lambda p, h: torch.optim.Adam(p, foreach=False, **h)),
    (
        "adam",
        {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
        lambda p, h: torch.optim.Adam(p, foreach=False, **h),
    ),
    ("adamw", {"lr": 1e-2, "weight_decay": 0.05}, lambda p, h: torch.optim.AdamW(p, foreach=False, **h)),
]


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize(("kind", "hyper", "make_torch"), TORCH_CASES)
@pytest.mark.parametrize(("n", "bs"), [(1000, 16), (1003, 16), (257, 1)])
def test_dense_updates_match_torch_optim(
    path: str, kind: str, hyper: dict[str, Any], make_torch: Any, n: int, bs: int
) -> None:
    rng = np.random.default_rng(0)
    init = rng.standard_normal(n).astype(np.float32)
    ref = torch.nn.Parameter(torch.from_numpy(init.copy()))
    topt = make_torch([ref], dict(hyper))
    ours = torch.nn.Parameter(torch.from_numpy(init.copy()))
    with forced_path(path):
        opt = make_sparse_optimizer(kind, **hyper)
        for _ in range(12):
            g = rng.standard_normal(n).astype(np.float32)
            ref.grad = torch.from_numpy(g.copy())
            topt.step()
            opt.step(0, ours, dense_update(g, bs))
    np.testing.assert_allclose(ours.detach().numpy(), ref.detach().numpy(), rtol=2e-5, atol=2e-6)


@pytest.mark.skipif(not FAST_PATHS, reason="no accelerated host path (numba missing)")
@pytest.mark.parametrize("kind", OPTIMIZER_KINDS)
@settings(deadline=None, max_examples=25)
@given(
    n=st.integers(1, 800),
    bs=st.sampled_from([1, 5, 16]),
    frac=st.floats(0.0, 1.0),
    steps=st.integers(1, 6),
    seed=st.integers(0, 2**31),
    wd=st.sampled_from([0.0, 0.01]),
)
def test_sparse_updates_match_the_reference(
    kind: str, n: int, bs: int, frac: float, steps: int, seed: int, wd: float
) -> None:
    hyper: dict[str, Any] = {"lr": 0.03, "weight_decay": wd}
    results = {}
    for path in CPU_PATHS:
        rng = np.random.default_rng(seed)
        p = rng.standard_normal(n).astype(np.float32)
        with forced_path(path):
            opt = make_sparse_optimizer(kind, **hyper)
            for _ in range(steps):
                opt.step(1, p, random_update(rng, n, bs, frac))
        results[path] = (p, opt.state_dict())
    ref_p, ref_state = results["numpy"]
    for path in FAST_PATHS:
        p, state = results[path]
        np.testing.assert_allclose(p, ref_p, rtol=1e-6, atol=1e-7)
        for name, arr in ref_state["params"].get(1, {}).items():
            np.testing.assert_allclose(state["params"][1][name], arr, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize("kind", OPTIMIZER_KINDS)
def test_untouched_elements_do_not_move(path: str, kind: str) -> None:
    """Lazy semantics (§3.1): momentum/Adam state does not move parameters that got no gradient."""
    rng = np.random.default_rng(3)
    p = rng.standard_normal(160).astype(np.float32)
    with forced_path(path):
        opt = make_sparse_optimizer(kind, lr=0.1, weight_decay=0.1)
        opt.step(0, p, dense_update(rng.standard_normal(160).astype(np.float32), 16))
        before = p.copy()
        idx = np.array([2, 7], np.int64)
        opt.step(0, p, SparsePayload(0, 160, 16, idx, rng.standard_normal(32).astype(np.float32)))
    moved = np.nonzero(p != before)[0] // 16
    assert set(moved.tolist()) <= {2, 7}
    assert set(moved.tolist()) == {2, 7}


@pytest.mark.parametrize("path", CPU_PATHS)
def test_adam_first_touch_is_a_first_adam_step(path: str) -> None:
    """Per-block step counters: a block first updated late gets the bias-corrected size-lr first step."""
    p = np.zeros(64, np.float32)
    with forced_path(path):
        opt = make_sparse_optimizer("adam", lr=0.01)
        for _ in range(50):
            opt.step(0, p, SparsePayload(0, 64, 16, np.array([0], np.int64), np.ones(16, np.float32)))
        opt.step(0, p, SparsePayload(0, 64, 16, np.array([3], np.int64), np.full(16, 5.0, np.float32)))
    np.testing.assert_allclose(p[48:], -0.01, rtol=1e-5)
    assert opt.state_dict()["params"][0]["steps"].tolist() == [50, 0, 0, 1]


@pytest.mark.parametrize("path", CPU_PATHS)
def test_torch_parameter_is_updated_in_place_and_version_bumped(path: str) -> None:
    t = torch.nn.Parameter(torch.zeros(48))
    ptr, version = t.data_ptr(), t._version
    with forced_path(path):
        make_sparse_optimizer("sgd", lr=1.0).step(
            0, t, SparsePayload(0, 48, 16, np.array([1], np.int64), np.ones(16, np.float32))
        )
    assert t.data_ptr() == ptr and t._version > version
    assert t.detach()[16:32].eq(-1).all() and t.detach()[:16].eq(0).all()


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize(
    "idx", [[0, 4], [2, 1], [1, 1], [-1]], ids=["out-of-range", "decreasing", "duplicate", "negative"]
)
@pytest.mark.parametrize("kind", OPTIMIZER_KINDS)
def test_bad_indices_are_refused_before_anything_is_written(path: str, idx: list[int], kind: str) -> None:
    p = np.zeros(64, np.float32)
    bad = SparsePayload(0, 64, 16, np.array(idx, np.int64), np.ones(16 * len(idx), np.float32))
    with forced_path(path):
        opt = make_sparse_optimizer(kind, lr=0.1)
        with pytest.raises(KernelError):
            opt.step(0, p, bad)
    assert not p.any()


def test_mismatches_are_kernel_errors() -> None:
    opt = make_sparse_optimizer("adam")
    p = np.zeros(64, np.float32)
    opt.step(0, p, SparsePayload(0, 64, 16, np.array([0], np.int64), np.ones(16, np.float32)))
    with pytest.raises(KernelError, match="length"):
        opt.step(0, p, SparsePayload(0, 65, 16, np.array([0], np.int64), np.ones(16, np.float32)))
    with pytest.raises(KernelError, match="block_size"):
        opt.step(0, p, SparsePayload(0, 64, 1, np.array([0], np.int64), np.ones(1, np.float32)))
    ro = np.zeros(64, np.float32)
    ro.flags.writeable = False
    with pytest.raises(KernelError, match="read-only"):
        opt.step(1, ro, SparsePayload(0, 64, 16, np.array([0], np.int64), np.ones(16, np.float32)))
    with pytest.raises(KernelError, match="float32"):
        opt.step(2, np.zeros(64), SparsePayload(0, 64, 16, np.array([0], np.int64), np.ones(16, np.float32)))


def test_fp16_and_bf16_updates_are_applied_in_fp32() -> None:
    p = np.zeros(16, np.float32)
    opt = make_sparse_optimizer("sgd", lr=1.0)
    opt.step(0, p, SparsePayload(0, 16, 16, np.array([0], np.int64), np.full(16, 0.5, np.float16), "fp16"))
    np.testing.assert_array_equal(p, -0.5)


@pytest.mark.parametrize("kind", OPTIMIZER_KINDS)
def test_state_dict_round_trip_continues_identically(kind: str) -> None:
    rng = np.random.default_rng(4)
    a = make_sparse_optimizer(kind, lr=0.05)
    pa = rng.standard_normal(100).astype(np.float32)
    for _ in range(3):
        a.step(5, pa, random_update(rng, 100, 16, 0.5))
    b = make_sparse_optimizer(kind, lr=0.9)
    b.load_state_dict(a.state_dict())
    assert b.lr == 0.05
    pb = pa.copy()
    upd = random_update(rng, 100, 16, 0.5)
    a.step(5, pa, upd)
    b.step(5, pb, upd)
    np.testing.assert_array_equal(pa, pb)
    state = a.state_dict()
    if kind != "sgd":
        name = next(k for k in state["params"][5] if k not in ("block_size", "dense_len"))
        state["params"][5][name] = np.zeros(3, np.float32)
        with pytest.raises(KernelError):
            b.load_state_dict(state)
    with pytest.raises(KernelError):
        b.load_state_dict({**state, "kind": "other"})


def test_lr_is_settable_and_validated() -> None:
    opt = make_sparse_optimizer("sgd", lr=0.1)
    opt.lr = 0.5
    assert opt.lr == 0.5
    with pytest.raises(ConfigError):
        opt.lr = -1.0


@pytest.mark.parametrize(
    ("kind", "hyper", "key"),
    [
        ("lbfgs", {}, "kind"),
        ("sgd", {"momentum": 0.9}, "momentum"),
        ("adam", {"lr": -1.0}, "lr"),
        ("adam", {"betas": (0.9, 1.0)}, "betas"),
        ("momentum", {"nesterov": True, "dampening": 0.5}, "nesterov"),
    ],
)
def test_bad_hyperparameters_are_config_errors(kind: str, hyper: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_sparse_optimizer(kind, **hyper)
    assert info.value.fields["key"] == key


def test_adamw_defaults_to_torch_weight_decay() -> None:
    assert make_sparse_optimizer("adamw").hyper()["weight_decay"] == 0.01


def test_bias_tables_grow_and_match_the_closed_form() -> None:
    from wanrt.kernels.reference import BiasTables

    tables = BiasTables(0.9, 0.999)
    bc1, bc2 = tables.upto(10)
    assert bc1.shape[0] > 10
    bc1, bc2 = tables.upto(1000)
    assert bc1.shape[0] > 1000
    for t in (1, 2, 10, 1000):
        assert bc1[t] == pytest.approx(1 - 0.9**t, rel=1e-14)
        assert bc2[t] == pytest.approx((1 - 0.999**t) ** 0.5, rel=1e-14)


def test_state_is_cache_line_aligned() -> None:
    """A 16-float block of state must be one 64-byte line, not two (NumPy's large arrays start at +16)."""
    opt = make_sparse_optimizer("adam")
    p = np.zeros(1000, np.float32)
    opt.step(0, p, SparsePayload(0, 1000, 16, np.array([0], np.int64), np.ones(16, np.float32)))
    st = opt._state[0]  # the allocation itself is what is checked
    for name in ("exp_avg", "exp_avg_sq"):
        assert st.arrays[name].ctypes.data % 64 == 0


@pytest.mark.parametrize(
    "state",
    [{"kind": "adam"}, {"kind": "adam", "lr": "x", "params": {}}, {"kind": "adam", "lr": 0.1, "params": []}],
)
def test_malformed_state_is_a_kernel_error(state: dict[str, Any]) -> None:
    with pytest.raises(KernelError):
        make_sparse_optimizer("adam").load_state_dict(state)
