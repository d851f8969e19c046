"""A parameter snapshot installed on the site leader reaches every rank of the site (two gloo processes),
and the decision that announces it survives the site broadcast's encoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from wanrt.client.site import decision as sm
from wanrt.client.site.broadcast import SiteChannel
from wanrt.errors import MalformedPayload


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        channel = SiteChannel(None, torch.device("cpu"), max_elements=1 << 20)
        if rank == 0:  # the leader installed the snapshot
            params = [
                torch.arange(5, dtype=torch.float32),
                torch.arange(6, dtype=torch.float32).reshape(3, 2),
            ]
        else:
            params = [torch.full((5,), -1.0), torch.full((3, 2), -1.0)]
        channel.params(params)
        torch.save(params, f"{out}/{rank}.pt")
        # the optimizer state that came with the snapshot (the leader's), then a snapshot without any
        lengths = (5, 5, 1)
        leader_state = [np.arange(n, dtype=np.float32) + 7 for n in lengths] if rank == 0 else []
        got = channel.optimizer_state(leader_state, lengths)
        none = channel.optimizer_state([], lengths)
        torch.save(([a.tolist() for a in got], none), f"{out}/{rank}-state.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_every_rank_of_the_site_ends_with_the_leader_s_parameters(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(f"file://{tmp_path}/init", str(tmp_path)), nprocs=2, join=True)
    leader, other = (torch.load(tmp_path / f"{r}.pt") for r in (0, 1))
    for a, b in zip(leader, other, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(other[0], torch.arange(5, dtype=torch.float32))
    (lead_state, lead_none), (other_state, other_none) = (
        torch.load(tmp_path / f"{r}-state.pt") for r in (0, 1)
    )
    assert other_state == lead_state == [[7, 8, 9, 10, 11], [7, 8, 9, 10, 11], [7]]
    assert lead_none == other_none == []


def test_the_snapshot_flag_travels_with_the_decision() -> None:
    header, body, values = sm.encode(sm.SiteDecision(snapshot=True))
    sm.decode_header(header, max_elements=1 << 20)
    assert sm.decode_body(header, body, values).snapshot
    header, body, values = sm.encode(sm.SiteDecision())
    assert not sm.decode_body(header, body, values).snapshot
    header[7] = 5
    with pytest.raises(MalformedPayload, match="snapshot/discarded flags"):
        sm.decode_header(header, max_elements=1 << 20)


@pytest.mark.parametrize("snapshot", [False, True])
@pytest.mark.parametrize("discarded", [False, True])
def test_the_discarded_flag_travels_beside_the_snapshot_flag(snapshot: bool, discarded: bool) -> None:
    header, body, values = sm.encode(sm.SiteDecision(snapshot=snapshot, discarded=discarded))
    sm.decode_header(header, max_elements=1 << 20)
    got = sm.decode_body(header, body, values)
    assert (got.snapshot, got.discarded) == (snapshot, discarded)
