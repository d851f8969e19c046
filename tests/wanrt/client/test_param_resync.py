"""Parameter resync in the client: the leader holds the updates that arrive while a snapshot is on its way,
installs it, applies the held updates it lacks; asked by a peer, it answers once every update below the
asked iteration is applied. One site, one rank, a scripted link (the gateway's part is tested in
tests/gateways/node/test_resync.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import wanrt
from tests.wanrt.client.fake_link import ScriptedLink
from wanrt.client import ClientConfig, SparseOptimizer
from wanrt.client.link.api import LinkSpec, ResyncStarted, ServeRequested, SnapshotArrived
from wanrt.client.link.param_resync import Snapshot, SnapshotReceiver
from wanrt.kernels import make_sparse_optimizer
from wanrt.kernels.state_transfer import export_state, state_lengths
from wanrt.payload import SparsePayload
from wanrt.protocol import Message, ParamAnnounce, ParamChunk

pytestmark = pytest.mark.usefixtures("single_rank_group")


class ServingLink(ScriptedLink):
    def __init__(self, spec: LinkSpec) -> None:
        super().__init__(spec)
        self.sent: list[Message] = []

    def inject(self, event: object) -> None:
        with self._lock:
            self._ready.insert(0, event)  # type: ignore[arg-type]

    def send_params(self, frames: list[Message]) -> None:
        self.sent.extend(frames)


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(20))
        self.b = torch.nn.Parameter(torch.zeros(36))

    def loss(self, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return (self.a * c).sum() + (self.b * d).sum()


def _coeffs(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(t)
    return torch.randn(20, generator=g), torch.randn(36, generator=g)


class Site:
    """One leader on a scripted link that records what it serves; ``step(t)`` is one training step."""

    def __init__(self, secret_file: Path, kind: str, lr: float) -> None:
        links: list[ServingLink] = []

        def factory(spec: LinkSpec) -> ServingLink:
            links.append(ServingLink(spec))
            return links[0]

        self.ctx = wanrt.client.init(
            "mem://gw",
            site="a",
            job="j",
            secret_file=secret_file,
            config=ClientConfig.dense_baseline(staleness=0, update_deadline_s=5.0),
            link_factory=factory,
        )
        self.model = TwoLayers()
        self.opt = SparseOptimizer(self.model.named_parameters(), kind, lr=lr, ctx=self.ctx)
        self.link = links[0]

    def step(self, t: int) -> None:
        c, d = _coeffs(t)
        self.model.loss(c, d).backward()
        self.opt.step()
        self.opt.zero_grad()


def test_the_leader_holds_updates_installs_the_snapshot_and_serves_its_own(secret_file: Path) -> None:
    site = Site(secret_file, "sgd", 1.0)
    ctx, model, link, step = site.ctx, site.model, site.link, site.step

    step(0)
    link.inject(ResyncStarted(1))
    step(1)  # iteration 1's update arrives and is held: the parameters do not move
    c0, _ = _coeffs(0)
    torch.testing.assert_close(model.a.detach(), -c0)
    rng = np.random.default_rng(3)
    snap_a, snap_b = rng.standard_normal(20).astype(np.float32), rng.standard_normal(36).astype(np.float32)
    # the snapshot (taken at K = 1 by a site that already applied iteration 1 of layer b)
    link.inject(SnapshotArrived(Snapshot(1, frozenset({(1, 1)}), [snap_a, snap_b])))
    step(2)
    c1, _ = _coeffs(1)
    # installed, then the held update of iteration 1 (layer a only: b's is in the snapshot); iteration 2
    # was pushed empty (the snapshot was pending: this site's gradients are left out), so its update is
    # empty here (the scripted link echoes this site's own push)
    torch.testing.assert_close(model.a.detach(), torch.from_numpy(snap_a) - c1)
    torch.testing.assert_close(model.b.detach(), torch.from_numpy(snap_b))
    assert ctx.discarded_steps == 1
    assert ctx.resyncs == 1

    link.inject(ServeRequested(7, 3))
    step(3)  # every update of iteration 3 applied (staleness 0): answered with K = 4
    announce = link.sent[0]
    assert isinstance(announce, ParamAnnounce) and announce.request == 7 and announce.iteration == 4
    assert announce.extras == () and announce.lengths == (20, 36)
    receiver = SnapshotReceiver((20, 36))
    receiver.pending, receiver._request = 3, 7  # as if it had asked
    receiver.on_announce(announce)
    got = None
    for frame in link.sent[1:]:
        assert isinstance(frame, ParamChunk)
        got = receiver.on_chunk(frame) or got
    assert got is not None
    np.testing.assert_array_equal(got.layers[0], model.a.detach().numpy())
    np.testing.assert_array_equal(got.layers[1], model.b.detach().numpy())
    ctx.close()


def test_the_optimizer_state_travels_with_the_parameters(secret_file: Path) -> None:
    """Adam's moments and step counters: served with the snapshot when the asker's optimizer has the same
    arrays, installed with it (else each site keeps its own; checked at the gateway and the receiver)."""
    site = Site(secret_file, "adam", 0.1)
    ctx, opt, link, step = site.ctx, site.opt, site.link, site.step
    lengths = state_lengths(opt._kernel, (20, 36), ctx.config.block_size)
    assert link.spec.state_lengths == lengths and len(lengths) == 6  # exp_avg, exp_avg_sq, steps per layer

    for t in range(3):
        step(t)
    link.inject(ServeRequested(7, 3, len(lengths)))
    step(3)
    receiver = SnapshotReceiver((20, 36), lengths)
    receiver.pending, receiver._request = 3, 7  # as if it had asked
    got = None
    for frame in link.sent:
        if isinstance(frame, ParamAnnounce):
            assert frame.state == 6 and frame.lengths == (20, 36, *lengths)
            receiver.on_announce(frame)
        else:
            assert isinstance(frame, ParamChunk)
            got = receiver.on_chunk(frame) or got
    assert got is not None
    served = export_state(opt._kernel, (20, 36), ctx.config.block_size)
    assert [a.tolist() for a in got.state] == [a.tolist() for a in served]
    assert max(float(a.max()) for a in got.state[2::3]) == 4  # four Adam steps on every block

    # asked without room for state (the asker's optimizer keeps none): the parameters alone
    link.sent.clear()
    link.inject(ServeRequested(8, 4, 0))
    step(4)
    first = link.sent[0]
    assert isinstance(first, ParamAnnounce) and first.state == 0 and first.lengths == (20, 36)

    # installing a snapshot with another site's state replaces this optimizer's state
    other = make_sparse_optimizer("adam", lr=0.1)
    pa, pb = np.zeros(20, np.float32), np.zeros(36, np.float32)
    for t in range(9):
        c, d = _coeffs(100 + t)
        other.step(0, pa, SparsePayload.from_dense_blocks(0, c.numpy(), np.arange(2), 16))
        other.step(1, pb, SparsePayload.from_dense_blocks(1, d.numpy(), np.arange(3), 16))
    theirs = export_state(other, (20, 36), 16)
    link.inject(ResyncStarted(6))
    step(5)
    link.inject(SnapshotArrived(Snapshot(6, frozenset(), [pa, pb], theirs)))
    step(6)
    assert ctx.resyncs == 1
    mine = export_state(opt._kernel, (20, 36), 16)
    # the installed state as it came: iteration 6 was pushed empty (the snapshot was pending), its update
    # moves nothing
    assert max(float(a.max()) for a in mine[2::3]) == 9
    step(7)
    mine = export_state(opt._kernel, (20, 36), 16)
    assert max(float(a.max()) for a in mine[2::3]) == 10  # moved on by this site's own update since
    ctx.close()
