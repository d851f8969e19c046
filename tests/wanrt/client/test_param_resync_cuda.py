"""Parameter resync with CUDA parameters and device optimizer state (cuda-marked): what a CUDA site serves
passes the snapshot checksum and equals what the same site on CPU serves, bit for bit; a CUDA site installs
another site's snapshot and optimizer state (host arrays) and trains on with that state on the device.
The CPU version of the same story is tests/wanrt/client/test_param_resync.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tests.cuda_support import CUDA_SKIP
from tests.wanrt.client.test_param_resync import ServingLink, TwoLayers, _coeffs
from tests.wanrt.kernels.conftest import forced_path
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.link.api import LinkSpec, ResyncStarted, ServeRequested, SnapshotArrived
from wanrt.client.link.param_resync import Snapshot, SnapshotReceiver
from wanrt.kernels import make_sparse_optimizer
from wanrt.kernels.arrays import is_cupy_array
from wanrt.kernels.state_transfer import export_state, state_lengths
from wanrt.payload import SparsePayload
from wanrt.protocol import ParamAnnounce, ParamChunk

pytestmark = [pytest.mark.cuda, CUDA_SKIP, pytest.mark.usefixtures("single_rank_group")]


class DeviceSite:
    def __init__(self, secret_file: Path, device: str) -> None:
        links: list[ServingLink] = []

        def factory(spec: LinkSpec) -> ServingLink:
            links.append(ServingLink(spec))
            return links[0]

        self.device = device
        self.ctx = wanrt.client.init(
            "mem://gw",
            site="a",
            job="j",
            secret_file=secret_file,
            config=ClientConfig.dense_baseline(staleness=0, update_deadline_s=5.0),
            link_factory=factory,
        )
        self.model = TwoLayers().to(device)
        self.opt = SparseOptimizer(self.model.named_parameters(), "adam", lr=0.1, ctx=self.ctx)
        self.link = links[0]

    def step(self, t: int) -> None:
        c, d = _coeffs(t)
        self.model.loss(c.to(self.device), d.to(self.device)).backward()
        self.opt.step()
        self.opt.zero_grad()

    def serve(self, request: int, at: int) -> Snapshot:
        """Train to ``at``, answer a peer's question for iteration ``at``, reassemble what was sent."""
        lengths = state_lengths(self.opt._kernel, (20, 36), 16)
        for t in range(at):
            self.step(t)
        self.link.inject(ServeRequested(request, at, len(lengths)))
        self.step(at)
        receiver = SnapshotReceiver((20, 36), lengths)
        receiver.pending, receiver._request = at, request  # as if it had asked
        got = None
        for frame in self.link.sent:
            if isinstance(frame, ParamAnnounce):
                receiver.on_announce(frame)
            else:
                assert isinstance(frame, ParamChunk)
                got = receiver.on_chunk(frame) or got  # None until complete; checksum-verified then
        assert got is not None and receiver.corrupt == 0
        return got


def test_a_cuda_site_serves_what_the_same_site_on_cpu_serves(secret_file: Path) -> None:
    with forced_path("numpy"):  # the reference the CuPy kernels equal bit for bit
        cpu = DeviceSite(secret_file, "cpu")
        on_cpu = cpu.serve(7, 3)
        cpu.ctx.close()
    gpu = DeviceSite(secret_file, "cuda")
    on_gpu = gpu.serve(7, 3)
    for a, b in zip(on_cpu.layers, on_gpu.layers, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(on_gpu.state) == 6
    for a, b in zip(on_cpu.state, on_gpu.state, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(on_gpu.layers[0], gpu.model.a.detach().cpu().numpy())
    gpu.ctx.close()


def test_a_cuda_site_installs_another_sites_state_and_trains_on(secret_file: Path) -> None:
    site = DeviceSite(secret_file, "cuda")
    for t in range(3):
        site.step(t)
    other = make_sparse_optimizer("adam", lr=0.1)
    pa, pb = np.zeros(20, np.float32), np.zeros(36, np.float32)
    for t in range(9):
        c, d = _coeffs(100 + t)
        other.step(0, pa, SparsePayload.from_dense_blocks(0, c.numpy(), np.arange(2), 16))
        other.step(1, pb, SparsePayload.from_dense_blocks(1, d.numpy(), np.arange(3), 16))
    theirs = export_state(other, (20, 36), 16)
    site.link.inject(ResyncStarted(4))
    site.step(3)
    site.link.inject(SnapshotArrived(Snapshot(4, frozenset(), [pa, pb], theirs)))
    site.step(4)
    assert site.ctx.resyncs == 1
    np.testing.assert_array_equal(site.model.a.detach().cpu().numpy(), pa)  # iteration 4 was pushed empty
    site.step(5)
    kernel = site.opt._kernel
    assert all(is_cupy_array(a) for a in kernel._state[0].arrays.values())  # the state moved to the device
    mine = export_state(kernel, (20, 36), 16)
    assert max(float(a.max()) for a in mine[2::3]) == 10  # nine of theirs, one of its own
    assert torch.isfinite(site.model.b).all()
    site.ctx.close()
