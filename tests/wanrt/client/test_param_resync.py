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


def test_the_leader_holds_updates_installs_the_snapshot_and_serves_its_own(secret_file: Path) -> None:
    links: list[ServingLink] = []

    def factory(spec: LinkSpec) -> ServingLink:
        links.append(ServingLink(spec))
        return links[0]

    ctx = wanrt.client.init(
        "mem://gw",
        site="a",
        job="j",
        secret_file=secret_file,
        config=ClientConfig.dense_baseline(staleness=0, update_deadline_s=5.0),
        link_factory=factory,
    )
    model = TwoLayers()
    opt = SparseOptimizer(model.named_parameters(), "sgd", lr=1.0, ctx=ctx)
    link = links[0]

    def step(t: int) -> None:
        c, d = _coeffs(t)
        model.loss(c, d).backward()
        opt.step()
        opt.zero_grad()

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
    (c1, _), (c2, d2) = _coeffs(1), _coeffs(2)
    # installed, then the held update of iteration 1 (layer a only: b's is in the snapshot) and iteration 2
    torch.testing.assert_close(model.a.detach(), torch.from_numpy(snap_a) - c1 - c2)
    torch.testing.assert_close(model.b.detach(), torch.from_numpy(snap_b) - d2)
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
