"""The leader's GPU-resident path (wanrt/client/leader/device_path.py).

On CPU tensors it runs the very code the CUDA path runs, minus the stream and the pinned copies, and must
give the host path's payloads bit for bit (error feedback, site scaling, dense baseline, resets). The
``cuda``-marked tests run it on the device: the same payloads as the host, only the selection staged to the
host, the side stream ordered after the gradient's producer, and a one-site client training on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tests.cuda_support import CUDA_SKIP
from tests.wanrt.client.fake_link import ScriptedLink, scripted
from tests.wanrt.kernels.conftest import forced_path
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.leader.compression import LayerCompressor
from wanrt.client.leader.device_path import DeviceLayerCompressor
from wanrt.payload import SparsePayload


def _same(a: SparsePayload, b: SparsePayload) -> None:
    assert (a.layer, a.dense_len, a.block_size) == (b.layer, b.dense_len, b.block_size)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.values_f32(), b.values_f32())


def _grads(steps: int, shapes: list[tuple[int, ...]], seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) * (1 + t % 3) for s in shapes] for t in range(steps)]


CONFIGS = {
    "threshold_v_block": ClientConfig(density=0.02),
    "threshold_v": ClientConfig(density=0.02, compressor="threshold_v", block_size=1),
    "topk_no_feedback": ClientConfig(density=0.05, compressor="topk", error_feedback=False),
    "dense": ClientConfig.dense_baseline(),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_cpu_tensors_give_the_host_paths_payloads(name: str, scale: float) -> None:
    cfg = CONFIGS[name]
    host, dev = LayerCompressor(cfg), DeviceLayerCompressor(cfg)
    shapes = [(40, 77), (1001,), (16,)]
    for t, grads in enumerate(_grads(8, shapes)):
        if t == 5:  # a resync drops every residual on both
            host.reset_residuals()
            dev.reset_residuals()
        for layer, g in enumerate(grads):
            flat = g.reshape(-1).numpy()
            expect = host.compress(layer, (flat * np.float32(scale)).astype(np.float32))
            _same(dev.compress_tensor(layer, g, None, scale), expect)
    assert dev.stats.layers == 8 * len(shapes) and dev.stats.d2h_bytes == 0  # nothing crossed a bus


def test_cpu_tensor_gradient_is_not_written() -> None:
    dev = DeviceLayerCompressor(ClientConfig(density=0.05))
    g = torch.randn(4000)
    before = g.clone()
    dev.compress_tensor(0, g, None, 0.5)
    dev.compress_tensor(0, g, None, 1.0)
    assert torch.equal(g, before)


class _Work:
    def __init__(self) -> None:
        self.waited = 0

    def wait(self) -> None:
        self.waited += 1


def test_the_reduce_is_waited_for_before_selection() -> None:
    dev, work = DeviceLayerCompressor(ClientConfig(density=0.05)), _Work()
    dev.compress_tensor(0, torch.randn(500), work, 1.0)
    assert work.waited == 1


# ---------------------------------------------------------------------------------------------- CUDA


@CUDA_SKIP
@pytest.mark.cuda
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cuda_tensors_give_the_host_paths_payloads(name: str) -> None:
    cfg = CONFIGS[name]
    host, dev = LayerCompressor(cfg), DeviceLayerCompressor(cfg)
    shapes = [(300, 257), (10_001,)]
    for grads in _grads(6, shapes, seed=1):
        for layer, g in enumerate(grads):
            expect = host.compress(layer, (g.reshape(-1).numpy() * np.float32(0.5)).astype(np.float32))
            gd = g.cuda()
            dev.mark_ready(layer, gd)
            _same(dev.compress_tensor(layer, gd, None, 0.5), expect)
    ratio = dev.stats.ratio
    assert ratio is not None
    if name == "dense":
        assert ratio >= 1.0
    else:  # only the selection crossed: values plus one int64 index per block
        assert ratio <= cfg.density * (1 + 8 / (4 * cfg.block_size)) * 1.3 + 1e-3


@CUDA_SKIP
@pytest.mark.cuda
def test_side_stream_waits_for_the_gradients_producer() -> None:
    """The gradient is produced by a long kernel chain queued just before; without the hook's event the
    side stream would read it half-written. The payload must equal the host's selection of the result.

    The chain keeps its values spread (``/ 16``: tanh does not saturate): with saturated values most block
    sums tie, and the exact pass's top-k breaks ties at the cut differently on the device (torch.topk) than
    on the host (argpartition), which is documented, not a race."""
    cfg = ClientConfig(density=0.01)
    host, dev = LayerCompressor(cfg), DeviceLayerCompressor(cfg)
    a = torch.randn(2048, 2048, device="cuda")
    for step in range(3):
        g = a
        for _ in range(20):
            g = torch.tanh(g @ a / 16) * 0.5
        dev.mark_ready(0, g)  # as the backward hook does, on the producing stream
        got = dev.compress_tensor(0, g, None, 1.0)
        _same(got, host.compress(0, g.reshape(-1).cpu().numpy()))
        assert got.nnz_blocks > 0, step


class _Coefficients(torch.nn.Module):
    """loss = <a, c> + <b, d>: each layer's gradient is exactly the coefficient fed in, on any device, so
    a CUDA run and a CPU run must agree bit for bit."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(20_000))
        self.b = torch.nn.Parameter(torch.zeros(3_603))

    def loss(self, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return (self.a * c).sum() + (self.b * d).sum()


@CUDA_SKIP
@pytest.mark.cuda
def test_one_site_client_trains_on_cuda_like_on_cpu(tmp_path: Path, single_rank_group: None) -> None:
    """The public client (wanrt.init, SparseOptimizer, backward, step) with a CUDA model: the pushes and the
    parameters equal the same run on CPU, bit for bit (selection on the device, sparse Adam on the device)."""
    secret = tmp_path / "job.key"
    secret.write_bytes(b"0123456789abcdef-test-secret\n")

    def run(device: str) -> tuple[list[SparsePayload], list[np.ndarray]]:
        links: list[ScriptedLink] = []
        ctx = wanrt.client.init(
            "mem://gw",
            site="a",
            job="j",
            secret_file=secret,
            config=ClientConfig(density=0.05, staleness=1, update_deadline_s=10.0),
            link_factory=scripted({0: "late"}, links),
        )
        model = _Coefficients().to(device)
        opt = SparseOptimizer(model.named_parameters(), "adam", lr=1e-2, ctx=ctx)
        gen = torch.Generator().manual_seed(1)
        for t in range(6):
            c, d = torch.randn(20_000, generator=gen), torch.randn(3_603, generator=gen) * (1 + t)
            model.loss(c.to(device), d.to(device)).backward()
            opt.step()
            opt.zero_grad()
        ctx.close()
        return [p for _, _, p in links[0].pushed], [p.detach().cpu().numpy() for p in model.parameters()]

    with forced_path("numpy"):  # the reference, which the CuPy path equals bit for bit
        cpu_pushes, cpu_params = run("cpu")
    cuda_pushes, cuda_params = run("cuda")
    assert len(cpu_pushes) == len(cuda_pushes) == 12
    for a, b in zip(cpu_pushes, cuda_pushes, strict=True):
        _same(a, b)
    for x, y in zip(cpu_params, cuda_params, strict=True):
        np.testing.assert_array_equal(x, y)
